"""The dashboard's token page: a signed-in person creates bearer tokens for the API and revokes them."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from occviz.api.models import ApiToken

MAX_NAME = ApiToken._meta.get_field("name").max_length or 64


@require_http_methods(["GET", "HEAD", "POST"])
@login_required
def token_list(request: HttpRequest) -> HttpResponse:
    """The person's tokens; a POST creates one and shows it, this once."""
    new_token = ""
    error = ""
    status = 200
    if request.method == "POST":
        name = request.POST.get("name", "").strip()
        if not name or len(name) > MAX_NAME or "\x00" in name:
            error = f"Give the token a name of 1 to {MAX_NAME} characters (what it is for: laptop, kubeconfig)."
            status = 400
        else:
            _, new_token = ApiToken.issue(request.user, name, read_only=request.POST.get("read_only") == "on")
    tokens = ApiToken.objects.filter(user_id=int(request.user.pk or 0))
    return render(
        request,
        "api/tokens.html",
        {"tokens": tokens, "new_token": new_token, "error": error, "server": request.build_absolute_uri("/")},
        status=status,
    )


@require_POST
@login_required
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    """Revoke (delete) one of the person's own tokens: a request with it is 401 from now on."""
    get_object_or_404(ApiToken, pk=token_id, user_id=request.user.pk).delete()
    return redirect("api_tokens")
