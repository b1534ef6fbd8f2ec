"""Routes of the dashboard pages and of the JSON endpoints their scripts read."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import path

from occviz.web import again, anomalies, views

urlpatterns = [
    path("", views.home, name="home"),
    path("favicon.ico", views.favicon, name="favicon"),
    path("accounts/login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("jobs/new/<slug:scenario>/", views.job_new, name="job_new"),
    path("jobs/compare/", views.job_compare, name="job_compare"),
    path("anomalies/", anomalies.anomalies_page, name="anomalies"),
    path("jobs/<int:job_id>/", views.job_detail, name="job_detail"),
    path("jobs/<int:job_id>/cancel/", views.job_cancel, name="job_cancel"),
    path("jobs/<int:job_id>/control/", views.job_control, name="job_control"),
    path("jobs/<int:job_id>/again/", again.job_again, name="job_again"),
    path("jobs/<int:job_id>/events.json", views.job_events, name="job_events"),
    path("jobs/<int:job_id>/summary.json", views.job_summary, name="job_summary"),
    path("jobs/<int:job_id>/snapshot.json", views.job_snapshot, name="job_snapshot"),
    path("jobs/<int:job_id>/fragments/", views.job_fragments, name="job_fragments"),
    path("jobs/<int:job_id>/export.<str:fmt>", views.job_export, name="job_export"),
    path("jobs/<int:job_id>/replay/", views.job_replay, name="job_replay"),
    path("watch/<slug:resource>/<slug:namespace>/<str:name>/", views.watch_page, name="watch"),
    path("watch/<slug:resource>/<slug:namespace>/<str:name>/history.json", views.watch_history, name="watch_history"),
]
