"""activity-app's ClientApp: fedstream's, learning this app's task.

The task goes by its import path, so that this module imports neither torch nor the task: on
a device whose SuperNode names an agent (node config ``agent``), each message's ClientApp
process stays light and the agent loads the task from the app Flower installed for the run.
Without an agent the ClientApp loads it itself.
"""

from edge_client.flower_app import make_client_app

app = make_client_app("activity_app.task:ActivityTask")
