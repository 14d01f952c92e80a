"""`manage.py tandem_token USERNAME --role viewer|operator|admin`: create the user if needed, give it exactly that
role and print a new API token — only the token on stdout, so that scripts can capture it. Tokens are stored
hashed: this is the only time the key is shown. `--rotate` revokes the user's other tokens.

    TOKEN=$(python manage.py tandem_token ci-bot --role operator)
    curl -H "Authorization: Token $TOKEN" http://127.0.0.1:8000/api/v1/deployments/
"""
from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from controlplane.auth import ROLE_GROUPS, Role, set_role
from controlplane.services.tokens import token_issue, token_revoke_all


class Command(BaseCommand):
    help = "Create or update an API user with a role and print a new token (stdout: the token only)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--role", required=True, choices=ROLE_GROUPS)
        parser.add_argument("--rotate", action="store_true", help="revoke the user's other tokens")

    def handle(self, *args, username: str, role: str, rotate: bool, **options):
        User = get_user_model()
        username = username.strip()
        try:
            User._meta.get_field(User.USERNAME_FIELD).run_validators(username)
        except Exception as exc:
            raise CommandError(f"invalid username {username!r}: {'; '.join(getattr(exc, 'messages', [str(exc)]))}")
        if not username:
            raise CommandError("the username must not be empty")
        with transaction.atomic():
            user, created = User.objects.get_or_create(**{User.USERNAME_FIELD: username})
            if created:
                # API-only account: it logs in with its token, never with a password.
                user.set_unusable_password()
                user.save()
            elif not user.is_active:
                raise CommandError(f"user {username!r} is inactive; reactivate it in the admin first")
            set_role(user, Role.parse(role))
            if rotate:
                token_revoke_all(user=user)
            key = token_issue(user=user, name="cli")
        self.stderr.write(f"{'created' if created else 'updated'} user {username!r} with role {role}")
        self.stdout.write(key)
