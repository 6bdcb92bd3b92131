"""Authentication (API keys and JWTs), accounts and scopes."""
