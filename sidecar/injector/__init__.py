"""`kvmoq injector`: the Kubernetes mutating admission webhook that adds the kvmoq sidecar to
pods labelled `kvmoq.io/inject: "true"`, as Istio and Linkerd inject theirs.

Layered as the rest of kvmoq: `template` (what to inject, rendered by the Helm chart from
the same named templates its own Deployments use), `pod_options` (a pod's annotations),
`mutation` (a pod in, a decision out; no I/O), `review` (AdmissionReview JSON in and out) and
`server` (HTTPS). Only `server` does I/O.
"""
