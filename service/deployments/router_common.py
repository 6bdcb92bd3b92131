"""What the deployment routers share: the caller dependency and the GPU specification path."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from service.auth import scopes
from service.auth.deps import require
from service.auth.service import Principal

Deployer = Annotated[Principal, Depends(require(scopes.DEPLOY_FUNCTION))]
SPEC_PATH = "/deployments/{deploymentId}/gpu-specifications/{gpuSpecificationId}"
