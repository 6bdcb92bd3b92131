"""The scope names of api.md §1."""

from __future__ import annotations

REGISTER_FUNCTION = "register_function"
LIST_FUNCTIONS = "list_functions"
LIST_FUNCTIONS_DETAILS = "list_functions_details"
UPDATE_FUNCTION = "update_function"
DELETE_FUNCTION = "delete_function"
DEPLOY_FUNCTION = "deploy_function"
INVOKE_FUNCTION = "invoke_function"
QUEUE_DETAILS = "queue_details"
LIST_CLUSTER_GROUPS = "list_cluster_groups"
MANAGE_REGISTRY_CREDENTIALS = "manage_registry_credentials"
#: the account's telemetry endpoints (NVCF's `manage_telemetries`)
MANAGE_TELEMETRIES = "manage_telemetries"
UPDATE_SECRETS = "update_secrets"
#: share the caller's functions with other accounts (NVCF's function authorizations)
AUTHORIZE_CLIENTS = "authorize_clients"
ADMIN = "admin"
#: NVCT's task scopes (the @PreAuthorize of its REST layer); `update_secrets` serves tasks too
LAUNCH_TASK = "launch_task"
LIST_TASKS = "list_tasks"
TASK_DETAILS = "task_details"
CANCEL_TASK = "cancel_task"
DELETE_TASK = "delete_task"
LIST_EVENTS = "list_events"
LIST_RESULTS = "list_results"
TASK_SCOPES = (
    LAUNCH_TASK,
    LIST_TASKS,
    TASK_DETAILS,
    CANCEL_TASK,
    DELETE_TASK,
    LIST_EVENTS,
    LIST_RESULTS,
    UPDATE_SECRETS,
)
#: operator-level: administer any account (mint keys for other accounts). Only the operator's
#: own credentials carry it: `nvcf-server create-key` and the bootstrap/generated admin key.
#: It can never be granted through the API nor taken from a JWT.
ADMIN_ACCOUNTS = "admin:accounts"
#: operator-level, NVCF's: manage accounts themselves (create, limits, suspend, delete); held
#: like `admin:accounts`, only by the operator's own credentials
ACCOUNT_SETUP = "account_setup"
#: either lets a caller read functions; the second adds the details
LIST_SCOPES = (LIST_FUNCTIONS, LIST_FUNCTIONS_DETAILS)

ALL_SCOPES: tuple[str, ...] = (
    REGISTER_FUNCTION,
    LIST_FUNCTIONS,
    LIST_FUNCTIONS_DETAILS,
    UPDATE_FUNCTION,
    DELETE_FUNCTION,
    DEPLOY_FUNCTION,
    INVOKE_FUNCTION,
    QUEUE_DETAILS,
    LIST_CLUSTER_GROUPS,
    MANAGE_REGISTRY_CREDENTIALS,
    MANAGE_TELEMETRIES,
    UPDATE_SECRETS,
    AUTHORIZE_CLIENTS,
    ADMIN,
    *TASK_SCOPES[:-1],
)

#: scopes only the operator's command line can grant
OPERATOR_SCOPES: tuple[str, ...] = (ADMIN_ACCOUNTS, ACCOUNT_SETUP)
#: what the operator's own admin key carries (bootstrap or generated at first start)
OPERATOR_KEY_SCOPES: tuple[str, ...] = (*ALL_SCOPES, *OPERATOR_SCOPES)
