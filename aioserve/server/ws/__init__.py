"""The websockets: ``/ws`` (generations) and ``/ws/stats`` (the dashboard's frames)."""
