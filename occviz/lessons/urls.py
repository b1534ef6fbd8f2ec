"""Routes of the lesson pages: the list, a lesson, its steps (one page each), running a step, a lesson run."""

from __future__ import annotations

from django.urls import path

from occviz.lessons import views

app_name = "lessons"
urlpatterns = [
    path("", views.lesson_list, name="list"),
    path("runs/<int:run_id>/", views.lesson_run, name="run"),
    path("<slug:slug>/", views.lesson_detail, name="detail"),
    path("<slug:slug>/<int:number>/", views.lesson_step, name="step"),
    path("<slug:slug>/<int:number>/run/", views.run_step, name="run_step"),
]
