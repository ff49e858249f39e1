"""Who is calling: the authentication schemes of the public listener (docs/security.md).

:class:`~cellactors.server.auth.authentication.Authentication` combines the schemes a node
is configured with (static API keys, JWT bearer tokens, an app's own ``authenticate``);
:mod:`cellactors.core.access` decides, from the principal it yields, what may be called.
"""

from cellactors.server.auth.api_keys import ApiKeys
from cellactors.server.auth.authentication import Authentication, Scheme
from cellactors.server.auth.jwt_bearer import JwtBearer

__all__ = ["ApiKeys", "Authentication", "JwtBearer", "Scheme"]
