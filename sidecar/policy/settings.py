"""Settings of the per-session policy: lease TTLs, return-time prediction and admission.

Each field is one CLI flag (``--policy-<field>`` / ``--admission-<field>``) and one key of the
``[policy]`` / ``[admission]`` tables of the TOML config file.

Cost units of the TTL rule: seconds of engine time. Recomputing a context of N tokens costs
``N * recompute_s_per_token * (1 + N / recompute_quadratic_tokens)``; holding N idle tokens for t
seconds costs ``kv_cost_weight * N * t``. For a session sure to return, holding pays up to the
break-even time ``recompute_s_per_token * (1 + N / Q) / kv_cost_weight`` (50 s for a short context
with the defaults, 126 s at 100K tokens).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class PolicySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Literal["off", "fixed", "predictive"] = Field(
        "off", description="Lease TTL policy: off (no leases), fixed (--policy-fixed-ttl), predictive."
    )
    fixed_ttl: float = Field(30.0, ge=0, description="Lease TTL in seconds for mode=fixed.")

    # --- predictive TTL: bounds and cost weights ---
    min_ttl: float = Field(
        0.5, ge=0, description="Shortest lease (s) in mode=predictive, given even when holding does not pay."
    )
    max_ttl: float = Field(600.0, gt=0, description="Longest lease (s) in mode=predictive.")
    final_answer_ttl: float = Field(
        2.0,
        ge=0,
        description="Lease (s) after a reply without tool calls (a final answer) in mode=predictive when a return "
        "is unlikely: the session never came back after one and most sessions ended after theirs (see "
        "sidecar.policy.final_answers; 0 = predict it like any reply).",
    )
    recompute_s_per_token: float = Field(
        5e-5, gt=0, description="Engine seconds to prefill one context token (1 / prefill throughput)."
    )
    recompute_quadratic_tokens: int = Field(
        65536,
        ge=0,
        description="Context length at which attention doubles the per-token recompute cost (0 = linear).",
    )
    kv_cost_weight: float = Field(
        1e-6, gt=0, description="Engine seconds charged per token-second of idle leased KV."
    )
    kv_pressure_gain: float = Field(
        1.0,
        ge=0,
        description="Holding cost grows by this factor times the KV pool's resident fraction (0 = ignore pressure).",
    )

    # --- return-time predictor ---
    prior_median_s: float = Field(
        2.0, gt=0, description="Median of the log-normal prior gap before anything is learned (s)."
    )
    final_answer_prior_median_s: float = Field(
        15.0,
        gt=0,
        description="Prior median gap (s) after a final answer (a reply without tool calls): a person reads it "
        "and writes again, so it is not learned from the tools' gaps (spread: prior_sigma).",
    )
    prior_sigma: float = Field(1.5, gt=0, description="Log-space spread of the prior gap distribution.")
    prior_weight: float = Field(
        4.0, ge=0, description="Pseudo-observations the prior counts for against the global histogram."
    )
    tool_shrinkage: float = Field(
        8.0, ge=0, description="Pseudo-observations of the global distribution mixed into each tool's."
    )
    session_shrinkage: float = Field(
        4.0, ge=0, description="Pseudo-observations pulling a session's speed factor toward 1."
    )
    half_life_obs: float = Field(
        50.0, gt=0, description="Observations after which an old gap counts half (forgetting; sets adaptation speed)."
    )
    horizon_s: float = Field(
        3600.0, gt=1, description="Gaps longer than this (s) count as 'not coming back'."
    )
    max_tools: int = Field(256, ge=1, description="Most tool names tracked; the least recently seen is dropped.")

    @model_validator(mode="after")
    def _check_bounds(self) -> PolicySettings:
        if self.min_ttl > self.max_ttl:
            raise ValueError(f"min_ttl ({self.min_ttl}) must not exceed max_ttl ({self.max_ttl})")
        if self.max_ttl > self.horizon_s:
            raise ValueError(f"max_ttl ({self.max_ttl}) must not exceed horizon_s ({self.horizon_s})")
        return self


class AdmissionSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(False, description="Gate new sessions on projected KV fit.")
    headroom: float = Field(
        0.9,
        gt=0,
        le=1.0,  # a fraction: more than the whole pool would admit sessions that cannot fit
        description="Admit a new session while resident sessions' projected tokens leave (1 - headroom) of max_total_num_tokens free: room for prefill chunks and decode growth, which only the GPU pool needs, so a host tier adds its whole size (0 < headroom <= 1).",
    )
    expected_growth_tokens: int = Field(
        1500, ge=0, description="Tokens a session is expected to add per turn before any is observed."
    )
    projection_turns: float = Field(
        1.0,
        ge=0,
        description="Turns ahead a session's context is projected (growth per turn x this); more keeps fewer "
        "sessions resident, so the ones admitted still fit as they grow.",
    )
    projection_horizon_s: float = Field(
        0.0,
        ge=0,
        description="Project growth over this many seconds instead of projection_turns: turns ahead = horizon / "
        "the learned turn cycle (service + tool gap), so agents with long tool gaps project fewer turns "
        "(0 = use projection_turns).",
    )
    host_tier_projection_turns: float = Field(
        16.0,
        ge=0,
        description="With a host tier (HiCache): turns of growth projected for every open session instead. Its KV "
        "stays in GPU + host until the session ends, so admission must leave room for what the sessions grow "
        "to, not for the next few turns.",
    )
    learn_session_turns: bool = Field(
        False,
        description="With a host tier: once sessions were seen to end, project each at the mean number of turns "
        "sessions took (a running mean, then an exponential one) instead of host_tier_projection_turns.",
    )
    host_tier_projection: Literal["full", "remaining", "peak"] = Field(
        "full",
        description="With a host tier, what an open session counts at: full = its context + all "
        "host_tier_projection_turns of growth until it closes; remaining = its context + the turns it has left of "
        "them (at least one), so a session near its end frees room for the next; peak = the most the open "
        "sessions and the new one hold at once over the turns ahead, each growing until its turns are done and "
        "then gone (remaining adds every session at its end, as if all ended at the same time).",
    )
    host_tier_recompute_share: float = Field(
        0.0,
        ge=0,
        le=1.0,
        description="With a host tier: admit a session past the budget when the KV it pushes out, taken from the "
        "agents between turns that cost least to lose and recomputed as each returns, costs at most this share of "
        "the engine's time (0 = the budget is a hard limit). Agents in long tool gaps return rarely, so losing "
        "their KV costs less than a new agent waiting at the door; agents in short gaps would recompute it every "
        "few seconds, so they keep the budget. Before any turn has ended (a wave of agents starting together) the "
        "loss is priced from the priors: every open session at its projected size, out for its predicted gap.",
    )
    host_tier_idle_weight: Literal["full", "duty_cycle"] = Field(
        "full",
        description="With a host tier, how a session between turns counts: full = all of it; duty_cycle = x "
        "service / (service + its predicted remaining gap), as idle_weight does without a host tier: the KV of "
        "an agent out for 20 s is needed a third of the time, and it is recomputed or reloaded when it is back.",
    )
    idle_weight: Literal["full", "duty_cycle"] = Field(
        "full",
        description="How an idle session under lease counts in the gate: full = its whole projection; "
        "duty_cycle = its projection x service / (service + predicted remaining gap), "
        "so leased KV of agents in long tool gaps does not keep new agents out.",
    )
    learn_growth: bool = Field(
        True, description="Learn the per-turn growth (append + output) from observed turns."
    )
    growth_prior_turns: float = Field(
        0.0,
        ge=0,
        description="Turns expected_growth_tokens counts for against the learned ones: the growth is then their mean "
        "(forgetting at 1 % a turn after 100), not an exponential average at 10 % a turn. The turns that end first "
        "are the short ones, so a wave of agents starting together would otherwise be admitted on the growth of "
        "its shortest first turns (0 = the exponential average).",
    )
    host_tier_capacity: Literal["sum", "distinct"] = Field(
        "sum",
        description="With a host tier, what the gate's budget counts: sum = GPU + host tokens; distinct = what "
        "the two tiers hold without duplicates: under SGLang's default write-through policy every GPU page is "
        "copied to host, so max(GPU, host); GPU + host under write_back.",
    )
    paced_turn_max_wait: float = Field(
        0.0,
        ge=0,
        description="With a host tier: a session let through at max_wait without room is paced: each of its later "
        "turns waits until its remaining growth fits (then it counts as admitted) or this many seconds, and no new "
        "session starts before it while it is back within this many seconds of its last turn (0 = off). A paced "
        "session adds a turn at a time instead of thrashing the admitted ones; the wait is part of that turn's time "
        "to first token.",
    )
    max_queue: int = Field(64, ge=0, description="Most new sessions waiting; beyond it they get 429.")
    max_wait: float = Field(
        120.0,
        ge=0,
        description="Seconds a waiting session waits at most before it is let through anyway (0 = no limit); the "
        "wait is part of its first turn's time to first token.",
    )
    retry_after: float = Field(
        5.0, ge=1, description="Least Retry-After (s) on 429; raised to the recent mean admission wait."
    )
    poll_interval: float = Field(
        0.5, gt=0, description="Seconds between re-checks of a waiting session (leases expire over time)."
    )
