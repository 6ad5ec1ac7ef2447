"""Job status for applications: ``get_status(message_id)`` from a request handler.

```python
from actors.status import get_status

def video_status(request, message_id):      # GET /videos/<id>/status
    status = get_status(message_id)
    if status is None:
        return 404, {"state": "unknown"}
    return 200, status.to_dict()             # state, progress, note, error, result, times
```

The implementation is :mod:`jobsystem.ops.status`; this module is its public name.
"""

from jobsystem.ops.status import JobStatus, get_status, queue_totals

__all__ = ["JobStatus", "get_status", "queue_totals"]
