"""activity-app's ServerApp: fedstream's, learning this app's task."""

from aggregator.server_app import make_server_app

from activity_app.task import ActivityTask

app = make_server_app(ActivityTask())
