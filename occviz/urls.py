"""URL routes of the dashboard, the admin and the API."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    # The dashboard first: the API's router also answers "" (its root), which must not hide the home page.
    path("", include("occviz.web.urls")),
    path("lessons/", include("occviz.lessons.urls")),
    path("", include("occviz.students.urls")),
    path("", include("occviz.api.urls")),
]
