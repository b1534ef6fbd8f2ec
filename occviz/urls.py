"""URL routes of the dashboard, the admin and the API."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("occviz.api.urls")),
    path("", include("occviz.web.urls")),
]
