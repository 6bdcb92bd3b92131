"""LLM gateway metrics on /metrics, per function and model (labels `function_id`, `model`,
`endpoint` — the OpenAI path; NVCF's gateway names the same figures
`llm_api_gateway_*`):

- `nvcf_llm_requests_total{status}`: requests by the status the caller got;
- `nvcf_llm_request_duration_seconds`: from the request to the end of its answer;
- `nvcf_llm_time_to_first_token_seconds`: streamed answers, to the first token;
- `nvcf_llm_stream_duration_seconds`: streamed answers, the whole stream;
- `nvcf_llm_tokens_total{token_type}`: `input`/`output` tokens from the worker's `usage`.

Requests refused before a model is known (no key, a malformed body) count under
`function_id="none"`, `model="none"`, as NVCF's gateway does.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from service.invocation.metrics import BUCKETS
from service.llm.sse import Usage

NONE = "none"


class LlmMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["function_id", "model", "endpoint"]
        self.requests = Counter(
            "nvcf_llm_requests_total",
            "LLM gateway requests by function, model, endpoint and status.",
            [*labels, "status"],
            registry=registry,
        )
        self.duration = Histogram(
            "nvcf_llm_request_duration_seconds",
            "LLM gateway request time, to the end of the answer.",
            labels,
            registry=registry,
            buckets=BUCKETS,
        )
        self.first_token = Histogram(
            "nvcf_llm_time_to_first_token_seconds",
            "Time from the request to the first streamed token.",
            labels,
            registry=registry,
            buckets=BUCKETS,
        )
        self.stream = Histogram(
            "nvcf_llm_stream_duration_seconds",
            "Duration of streamed answers.",
            labels,
            registry=registry,
            buckets=BUCKETS,
        )
        self.tokens = Counter(
            "nvcf_llm_tokens_total",
            "Tokens the workers reported, by type (input, output).",
            [*labels, "token_type"],
            registry=registry,
        )

    def request(
        self, function_id: str, model: str, endpoint: str, status: int, seconds: float
    ) -> None:
        self.requests.labels(function_id, model, endpoint, str(status)).inc()
        self.duration.labels(function_id, model, endpoint).observe(seconds)

    def streamed(
        self, function_id: str, model: str, endpoint: str, first: float | None, seconds: float
    ) -> None:
        if first is not None:
            self.first_token.labels(function_id, model, endpoint).observe(first)
        self.stream.labels(function_id, model, endpoint).observe(seconds)

    def used(self, function_id: str, model: str, endpoint: str, usage: Usage | None) -> None:
        if usage is None:
            return
        self.tokens.labels(function_id, model, endpoint, "input").inc(usage.input_tokens)
        self.tokens.labels(function_id, model, endpoint, "output").inc(usage.output_tokens)
