"""Validated run configuration: one YAML file, checked completely before any model loads.

``schema`` declares every option (documented where it is declared); ``loading`` reads a
file with its preset and ``key=value`` overrides; ``reference`` writes docs/config.md. It
imports nothing else of mappa, so `mappa train --config bad.yaml` fails without torch.
"""

from mappa.config.loading import load_config
from mappa.config.reference import reference_markdown
from mappa.config.schema import (
    RESUMABLE_KEYS,
    ActorResources,
    AgentConfig,
    AnswerFormat,
    ClusterConfig,
    CoachConfig,
    ConfigError,
    EvalConfig,
    HttpCoachConfig,
    LoraConfig,
    RLConfig,
    RunConfig,
    SandboxConfig,
    WorkflowConfig,
    reserved_name_problem,
)

__all__ = [
    "RESUMABLE_KEYS",
    "ActorResources",
    "AgentConfig",
    "AnswerFormat",
    "ClusterConfig",
    "CoachConfig",
    "ConfigError",
    "EvalConfig",
    "HttpCoachConfig",
    "LoraConfig",
    "RLConfig",
    "RunConfig",
    "SandboxConfig",
    "WorkflowConfig",
    "load_config",
    "reference_markdown",
    "reserved_name_problem",
]
