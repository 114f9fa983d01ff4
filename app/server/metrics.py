"""Prometheus metrics for one server (its own registry: no globals)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("specdeck_requests_total", "Requests by route and status", ["route", "status"], registry=r)
        self.prompt_tokens = Counter("specdeck_prompt_tokens_total", "Prompt tokens", registry=r)
        self.completion_tokens = Counter("specdeck_completion_tokens_total", "Generated tokens", registry=r)
        self.reused_tokens = Counter("specdeck_prompt_cache_tokens_total", "Prompt tokens served from the cache", registry=r)
        self.drafted = Counter("specdeck_draft_tokens_total", "Drafted tokens", registry=r)
        self.accepted = Counter("specdeck_draft_accepted_total", "Drafted tokens the target kept", registry=r)
        self.key_limited = Counter("specdeck_key_limited_total", "Requests refused (429) for their key's per-minute limit "
                                   "(not in specdeck_requests_total: the server was not busy)", ["key"], registry=r)
        self.errors = Counter("specdeck_errors_total", "Failed requests", ["kind"], registry=r)
        self.client_gone = Counter("specdeck_client_gone_total", "Requests whose client went away before the answer "
                                   "(499; not errors)", registry=r)
        self.ttft = Histogram("specdeck_ttft_seconds", "Time to first token", registry=r,
                              buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
        self.tokens_per_second = Gauge("specdeck_tokens_per_second", "Generated tokens per second, last 10 s", registry=r)
        self.acceptance = Gauge("specdeck_acceptance_rate", "Accepted / drafted, all requests so far", registry=r)
        self.queue_depth = Gauge("specdeck_queue_depth", "Requests waiting for a slot", registry=r)
        self.busy_slots = Gauge("specdeck_busy_slots", "Slots generating", registry=r)
        self.vram_used = Gauge("specdeck_vram_used_bytes", "GPU memory in use (GPU 0)", registry=r)
        self.ram_used = Gauge("specdeck_process_rss_bytes", "Resident memory of the server", registry=r)
        self.queue_limit = Gauge("specdeck_queue_limit", "Requests the queue holds before 429 (--max-queue)", registry=r)
        self.slots = Gauge("specdeck_slots", "Slots the server has (the plan's parallel)", registry=r)
        # what inference-aware routers read (the Gateway API Inference Extension's model-server protocol)
        self.kv_usage = Gauge("specdeck_kv_cache_usage_ratio",
                              "KV-cache cells held by requests in flight over the context's cells (0-1)", registry=r)
        self.cache_info = Gauge("specdeck_cache_config_info",
                                "The KV cache's shape, in its labels, as vLLM's cache_config_info: block_size (tokens a "
                                "block holds; llama.cpp keeps its cache per token: 1) and num_gpu_blocks (the context's cells)",
                                ["block_size", "num_gpu_blocks"], registry=r)
        self.saved_bytes = Gauge("specdeck_prompt_cache_host_bytes",
                                 "Host memory held by prompt caches of taken slots (--cache-ram)", registry=r)
        self.cache_host_bytes = Gauge("specdeck_cache_host_bytes", "Host memory the bounded caches hold: saved "
                                      "prompts and the suffix index (about 125 bytes a token)", registry=r)
        self.saved_prompts = Gauge("specdeck_prompt_cache_host_prompts", "Prompt caches of taken slots in host memory",
                                   registry=r)
        self.vram_planned = Gauge("specdeck_vram_planned_bytes", "GPU memory the plan sized the server for", registry=r)
        self.fallback = Gauge("specdeck_fallback_active",
                              "1 while a fallback serves in place of a start that failed (see /v1/status)", registry=r)
        self.alert = Gauge("specdeck_alert", "1 while the named alert is raised", ["name"], registry=r)
        self.tbt = Gauge("specdeck_time_between_tokens_seconds", "Time between an answer's steps (a step may bring "
                         "several tokens), over the last 30 s, by quantile (0.5, 0.95)", ["quantile"], registry=r)
        self.slot_tokens_per_decode = Gauge("specdeck_slot_tokens_per_decode",
                                            "Tokens per target decode of the slot's steps, last 30 s", ["slot"], registry=r)
        self.slot_head_acceptance = Gauge("specdeck_slot_mtp_head_acceptance",
                                          "Accepted / drafted of the MTP head's drafts in the slot, last 30 s", ["slot"], registry=r)
        gpu = ["gpu"]
        self.gpu_temperature = Gauge("specdeck_gpu_temperature_celsius", "GPU temperature", gpu, registry=r)
        self.gpu_slowdown = Gauge("specdeck_gpu_temperature_slowdown_celsius", "Where the GPU starts to throttle", gpu, registry=r)
        self.gpu_power = Gauge("specdeck_gpu_power_watts", "GPU power draw", gpu, registry=r)
        self.gpu_power_limit = Gauge("specdeck_gpu_power_limit_watts", "GPU enforced power limit", gpu, registry=r)
        self.gpu_utilization = Gauge("specdeck_gpu_utilization_ratio", "GPU busy share (0-1)", gpu, registry=r)
        self.gpu_memory_used = Gauge("specdeck_gpu_memory_used_bytes", "GPU memory in use", gpu, registry=r)
        self.gpu_memory_total = Gauge("specdeck_gpu_memory_total_bytes", "GPU memory in all", gpu, registry=r)

    def status_counts(self) -> tuple[int, int, int]:
        """(requests answered, of them failed: 4xx/5xx but 429/529, of them refused as the server was too
        busy: 429/529; a key's limit is counted apart, in key_limited), from the counter.
        499 (the client went away before its answer) is the client's doing: not counted here at all."""
        total = failed = rejected = 0
        for family in self.requests.collect():
            for m in family.samples:
                if not m.name.endswith("_total"):
                    continue
                n, status = int(m.value), m.labels.get("status", "")
                if status == "499":
                    continue
                total += n
                if status in ("429", "529"):
                    rejected += n
                elif status[:1] in ("4", "5"):
                    failed += n
        return total, failed, rejected

    def acceptance_rate(self) -> float | None:
        """Accepted / drafted over all requests so far, read through the registry's public API."""
        drafted = self.registry.get_sample_value("specdeck_draft_tokens_total") or 0.0
        accepted = self.registry.get_sample_value("specdeck_draft_accepted_total") or 0.0
        return accepted / drafted if drafted else None
