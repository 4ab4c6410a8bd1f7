"""admission.k8s.io/v1 AdmissionReview in, AdmissionReview out: the webhook's wire format.

The API server posts an AdmissionReview whose `request` holds the object; the answer echoes
the request's `uid` and says allowed or not, with a base64 JSONPatch for a mutation.
Anything that is not such a review is a `ReviewError`, answered 400 by the server.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from sidecar.injector.mutation import Decision, Inject, Refuse
from sidecar.injector.template import Json

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"
MAX_REVIEW_BYTES = 8 << 20
"""The API server's own limit on a request body is 3 MiB; a review carries the object and,
on updates, the old object too."""
MAX_UID_LENGTH = 128
POD = {"group": "", "version": "v1", "kind": "Pod"}


class ReviewError(ValueError):
    """Not an AdmissionReview this webhook can answer."""


@dataclass(frozen=True)
class AdmissionRequest:
    uid: str
    operation: str
    namespace: str
    pod: Any
    """The object when the request is for a Pod, else None."""

    @classmethod
    def parse(cls, body: bytes) -> AdmissionRequest:
        if len(body) > MAX_REVIEW_BYTES:
            raise ReviewError(f"body longer than {MAX_REVIEW_BYTES} bytes")
        try:
            review = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ReviewError(f"not JSON: {exc}") from None
        if not isinstance(review, dict):
            raise ReviewError("expected a JSON object")
        if review.get("apiVersion") != API_VERSION or review.get("kind") != KIND:
            raise ReviewError(f"expected an {API_VERSION} {KIND}")
        request = review.get("request")
        if not isinstance(request, dict):
            raise ReviewError("the review has no request")
        uid = request.get("uid")
        if not isinstance(uid, str) or not 0 < len(uid) <= MAX_UID_LENGTH:
            raise ReviewError("request.uid must be a non-empty string")
        kind = request.get("kind")
        is_pod = isinstance(kind, dict) and {k: kind.get(k) for k in POD} == POD
        return cls(
            uid=uid,
            operation=str(request.get("operation", "")),
            namespace=str(request.get("namespace", "")),
            pod=request.get("object") if is_pod else None,
        )


def response(uid: str, decision: Decision | None) -> Json:
    """The review to send back; None: allowed as it is (not a pod creation)."""
    answer: Json = {"uid": uid, "allowed": True}
    if isinstance(decision, Inject) and decision.patch:
        patch = json.dumps(decision.patch).encode()
        answer |= {"patchType": "JSONPatch", "patch": base64.b64encode(patch).decode()}
    elif isinstance(decision, Refuse):
        answer = {
            "uid": uid,
            "allowed": False,
            "status": {"code": 400, "message": f"kvmoq injector: {decision.message}"},
        }
    return {"apiVersion": API_VERSION, "kind": KIND, "response": answer}
