#!/usr/bin/env bash
# Make sure the local RabbitMQ (with its management plugin) and Redis answer, starting them where
# they are installed but not running. Used by `make services` and `.ci/run`.
set -euo pipefail

AMQP_PORT=${AMQP_PORT:-5672}
MANAGEMENT_URL=${MANAGEMENT_CHECK_URL:-http://guest:guest@127.0.0.1:15672/api/overview}
REDIS_PORT=${REDIS_PORT:-6379}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_until() {  # wait_until SECONDS DESCRIPTION COMMAND...
  local seconds=$1 what=$2; shift 2
  for _ in $(seq "$((seconds * 2))"); do
    if "$@"; then return 0; fi
    sleep 0.5
  done
  echo "services: $what did not come up within ${seconds}s" >&2
  return 1
}

management_up() { curl -fsS -o /dev/null "$MANAGEMENT_URL"; }

if ! redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; then
  command -v redis-server >/dev/null || { echo "services: redis-server is not installed" >&2; exit 1; }
  echo "services: starting redis on port $REDIS_PORT"
  mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$REDIS_PORT" --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  wait_until 30 redis redis-cli -p "$REDIS_PORT" ping
fi

if ! port_open "$AMQP_PORT"; then
  command -v rabbitmq-server >/dev/null || { echo "services: rabbitmq-server is not installed" >&2; exit 1; }
  echo "services: starting rabbitmq"
  rabbitmq-server -detached
  rabbitmqctl await_startup --timeout 120 >/dev/null
  wait_until 60 "rabbitmq (AMQP)" port_open "$AMQP_PORT"
fi

if ! management_up; then
  echo "services: enabling rabbitmq_management"
  rabbitmq-plugins enable rabbitmq_management >/dev/null
  wait_until 60 "rabbitmq management API" management_up
fi

echo "services: rabbitmq (amqp :$AMQP_PORT, management) and redis (:$REDIS_PORT) are up"
