FROM python:3.11-slim
WORKDIR /app
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY pyproject.toml README.md ./
COPY jobsystem ./jobsystem
COPY actors ./actors
COPY middleware ./middleware
COPY scheduler ./scheduler
COPY jobctl ./jobctl
COPY demo ./demo
COPY dashboard ./dashboard
RUN pip install --no-cache-dir . && useradd --create-home jobs && mkdir -p /data/reports && chown jobs /data/reports
USER jobs
# SIGTERM reaches the dramatiq parent, which lets running jobs finish (see stop_grace_period in compose.yaml).
STOPSIGNAL SIGTERM
CMD ["jobctl", "worker"]
