"""activity-app's ClientApp: fedstream's, learning this app's task."""

from edge_client.flower_app import make_client_app

from activity_app.task import ActivityTask

app = make_client_app(ActivityTask())
