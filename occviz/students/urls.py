"""Routes of the student pages (/s/<token>/) and of the teacher's link controls."""

from __future__ import annotations

from django.urls import path

from occviz.students import views

app_name = "students"
urlpatterns = [
    path("s/<str:token>/", views.student_page, name="page"),
    path("s/<str:token>/events.json", views.student_events, name="events"),
    path("s/<str:token>/press/", views.student_press, name="press"),
    path("jobs/<int:job_id>/student-links/", views.link_create, name="link_create"),
    path("student-links/<int:link_id>/revoke/", views.link_revoke, name="link_revoke"),
]
