"""
The users and permissions room: ``/api/users...``, ``/api/permissions...``,
``/api/vhosts/{v}/permissions``, ``/api/user-limits...``
(``rabbit_mgmt_wm_users``, ``_user``, ``_permissions``, ``_permission``,
``_user_limits``); administrators only, but for a user's own limits.
"""

from otter_tx.broker.access import PasswordHashError, User
from otter_tx.broker.vhost import LimitError
from otter_tx.web import _format as fmt
from otter_tx.web.management._room import Room, endpoint, roomApp
from otter_tx.web.management.authz import ADMIN, ANY
from otter_tx.web.management.http import Response, badRequest, notFound


def permissionList(broker):
    """Every user's permissions, ``[{"user","vhost","configure","write","read"}]`` by (user, vhost)."""
    return [
        {"user": u, "vhost": v, "configure": p[0], "write": p[1], "read": p[2]}
        for (u, v), p in sorted(broker.permissions.items())
    ]


class UsersRoom(Room):
    """Users, their permissions and limits."""

    app = roomApp()

    @app.route("/api/users", methods=["GET", "OPTIONS"])
    @endpoint(ADMIN)
    def users(self, request, user):
        """``GET /api/users``."""
        return [fmt.userDict(u, self.broker.userLimits.get(u.name)) for _, u in sorted(self.broker.users.items())]

    @app.route("/api/users/bulk-delete", methods=["POST", "OPTIONS"])
    @endpoint(ADMIN)
    def usersBulkDelete(self, request, user):
        """
        ``POST /api/users/bulk-delete`` with ``{"users": ["a", "b"]}``: deletes
        them in order (permissions too), 204.  At the first missing one it
        stops with 400 ``{"error":"bad_request","reason":["no_such_user",
        "x"]}`` (the ones before it are gone), as RabbitMQ 3.10; 400
        ``[{key_missing,users}]`` without ``users``.  Administrators only.
        """
        body = self._body(request)
        self._require(body, "users")
        names = body["users"]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise badRequest("users must be a list of names")  # RabbitMQ 3.10 answers 500
        for name in names:
            if name not in self.broker.users:
                raise badRequest(["no_such_user", name])
            self.broker.deleteUser(name)
        return Response(204)

    @app.route("/api/users/<name>", methods=["GET", "PUT", "DELETE", "OPTIONS"])
    @endpoint(ADMIN)
    def user(self, request, user, name):
        """
        ``GET``; ``PUT {"password" | "password_hash", "tags"}`` (tags a
        list or a comma-separated string; 201 / 204; an existing user keeps
        its password when neither is given); ``DELETE`` (204 / 404; its
        permissions go too).
        """
        broker = self.broker
        existing = broker.users.get(name)
        if request.method == b"GET":
            if existing is None:
                raise notFound()
            return fmt.userDict(existing, self.broker.userLimits.get(name))
        if request.method == b"DELETE":
            if existing is None:
                raise notFound()
            broker.deleteUser(name)
            return Response(204)
        body = self._body(request)
        tags = body.get("tags", [])
        if isinstance(tags, str):
            tags = [t.strip() for t in tags.split(",") if t.strip()]
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise badRequest("tags must be a list or a comma-separated string")
        password = body.get("password")
        phash = body.get("password_hash")
        if password is not None:
            broker.addUser(name, str(password), tags)
        elif phash is not None:
            self._replaceUser(name, tags, phash, body.get("hashing_algorithm"))
        elif existing is not None:
            broker.setUserTags(name, tags)
        else:
            self._replaceUser(name, tags, "", None)
        return Response(204 if existing is not None else 201)

    def _replaceUser(self, name, tags, passwordHash, algorithm):
        """
        Install user ``name`` with a RabbitMQ ``password_hash`` made with
        ``hashing_algorithm`` (sha256 when None; ``""``: no password); 400
        ``invalid password_hash`` / ``unknown hashing_algorithm ...``.
        """
        u = User(name, None, tags)
        try:
            u.setPasswordHash(passwordHash, algorithm)
        except PasswordHashError as e:
            raise badRequest(str(e))
        self.broker.putUser(u)

    @app.route("/api/permissions", methods=["GET", "OPTIONS"])
    @endpoint(ADMIN)
    def permissions(self, request, user):
        """``GET /api/permissions``."""
        return permissionList(self.broker)

    @app.route("/api/users/<name>/permissions", methods=["GET", "OPTIONS"])
    @endpoint(ADMIN)
    def userPermissions(self, request, user, name):
        """``GET /api/users/{name}/permissions``."""
        if name not in self.broker.users:
            raise notFound()
        return [p for p in permissionList(self.broker) if p["user"] == name]

    @app.route("/api/permissions/<vhost>/<name>", methods=["GET", "PUT", "DELETE", "OPTIONS"])
    @endpoint(ADMIN)
    def permission(self, request, user, vhost, name):
        """
        ``GET``; ``PUT {"configure", "write", "read"}`` (201 / 204; 400
        ``vhost_or_user_not_found``); ``DELETE`` (204 / 404).
        """
        key = (name, vhost)
        perms = self.broker.permissions.get(key)
        if request.method == b"GET":
            if perms is None:
                raise notFound()
            return {"user": name, "vhost": vhost, "configure": perms[0], "write": perms[1], "read": perms[2]}
        if request.method == b"DELETE":
            if perms is None:
                raise notFound()
            self.broker.clearPermissions(name, vhost)
            return Response(204)
        body = self._body(request)
        self._require(body, "configure", "write", "read")
        if vhost not in self.broker.vhosts or name not in self.broker.users:
            raise badRequest("vhost_or_user_not_found")
        self.broker.setPermissions(name, vhost, str(body["configure"]), str(body["write"]), str(body["read"]))
        return Response(204 if perms is not None else 201)

    @app.route("/api/vhosts/<vhost>/permissions", methods=["GET", "OPTIONS"])
    @endpoint(ADMIN)
    def vhostPermissions(self, request, user, vhost):
        """``GET /api/vhosts/{vhost}/permissions``."""
        self._vhost(vhost)
        return [p for p in permissionList(self.broker) if p["vhost"] == vhost]

    def _userLimits(self, user, names):
        """``[{"user","value"}]`` for ``names`` with limits; a non-administrator sees only itself."""
        limits = self.broker.userLimits
        return [
            {"user": name, "value": dict(limits[name])}
            for name in sorted(names)
            if name in limits and (self._isAdmin(user) or name == user.name)
        ]

    @app.route("/api/user-limits", methods=["GET", "OPTIONS"])
    @endpoint(ANY)
    def userLimitsAll(self, request, user):
        """
        ``GET /api/user-limits``: ``[{"user": "u", "value":
        {"max-connections": N, "max-channels": N}}]`` of the users with limits
        (a non-administrator sees only its own).
        """
        return self._userLimits(user, self.broker.userLimits)

    @app.route("/api/user-limits/<name>", methods=["GET", "OPTIONS"])
    @endpoint(ANY)
    def userLimits(self, request, user, name):
        """``GET /api/user-limits/{user}``: as the list for one user (``[]`` without limits; 404 for no such user)."""
        if name not in self.broker.users:
            raise notFound()
        return self._userLimits(user, [name])

    @app.route("/api/user-limits/<name>/<limit>", methods=["PUT", "DELETE", "OPTIONS"])
    @endpoint(ADMIN)
    def userLimit(self, request, user, name, limit):
        """
        ``PUT /api/user-limits/{user}/{limit}`` with ``{"value": N}`` and
        ``DELETE``: 204; administrators only.  ``max-connections`` and
        ``max-channels`` (negative: no limit), enforced on AMQP with 530
        NOT_ALLOWED as RabbitMQ 3.10.  400 ``max-channels should be a
        number, actually was <<"x">>`` / ``Unrecognised terms
        [{<<"foo">>,1}] in user-limits`` (no ``Validation failed`` prefix,
        as 3.10), 400 ``[{key_missing,value}]``, 400 ``["no_such_user","u"]``
        for a PUT to a missing user (404 for DELETE).  Stored with the user.
        """
        if name not in self.broker.users:
            if request.method == b"DELETE":
                raise notFound()
            raise badRequest(["no_such_user", name])
        if request.method == b"DELETE":
            self.broker.clearUserLimit(name, limit)
            return Response(204)
        body = self._body(request)
        self._require(body, "value")
        try:
            self.broker.setUserLimit(name, limit, body["value"])
        except LimitError as e:
            raise badRequest(str(e))
        return Response(204)
