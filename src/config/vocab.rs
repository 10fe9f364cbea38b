//! The config's vocabulary: the names a file may use for strategies and capabilities, and the
//! blend weights of the scored strategies. The ground floor of `config`: the defaults, the file
//! format and the checked types all speak it, and it imports none of them.

use serde::Deserialize;

/// How candidates are ordered: a model's deployments (`models.<name>.strategy`, written as
/// [`Strategy::as_str`] or one of the aliases [`Strategy::parse`] accepts), or a chain's models
/// in their configured order ([`Strategy::Chain`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// A chain's configured order.
    Chain,
    Priority,
    PriorityCheapest,
    Cheapest,
    Fastest,
    /// `highest_availability` / `reliable`.
    Reliable,
    Balanced,
    Smartest,
    Custom,
    RoundRobin,
    Random,
    LeastInflight,
    P2cEwma,
    /// `weighted` / `canary`.
    Weighted,
    PrefixAffinity,
}

impl Strategy {
    pub const ALL: [Strategy; 15] = [
        Strategy::Chain,
        Strategy::Priority,
        Strategy::PriorityCheapest,
        Strategy::Cheapest,
        Strategy::Fastest,
        Strategy::Reliable,
        Strategy::Balanced,
        Strategy::Smartest,
        Strategy::Custom,
        Strategy::RoundRobin,
        Strategy::Random,
        Strategy::LeastInflight,
        Strategy::P2cEwma,
        Strategy::Weighted,
        Strategy::PrefixAffinity,
    ];

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "chain" => Strategy::Chain,
            "priority" => Strategy::Priority,
            "priority_cheapest" => Strategy::PriorityCheapest,
            "cheapest" => Strategy::Cheapest,
            "fastest" | "latency" => Strategy::Fastest,
            "highest_availability" | "reliable" => Strategy::Reliable,
            "balanced" => Strategy::Balanced,
            "smartest" => Strategy::Smartest,
            "custom" => Strategy::Custom,
            "round_robin" => Strategy::RoundRobin,
            "random" => Strategy::Random,
            "least_inflight" => Strategy::LeastInflight,
            "p2c_ewma" => Strategy::P2cEwma,
            "weighted" | "canary" => Strategy::Weighted,
            "prefix_affinity" => Strategy::PrefixAffinity,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Chain => "chain",
            Strategy::Priority => "priority",
            Strategy::PriorityCheapest => "priority_cheapest",
            Strategy::Cheapest => "cheapest",
            Strategy::Fastest => "fastest",
            Strategy::Reliable => "reliable",
            Strategy::Balanced => "balanced",
            Strategy::Smartest => "smartest",
            Strategy::Custom => "custom",
            Strategy::RoundRobin => "round_robin",
            Strategy::Random => "random",
            Strategy::LeastInflight => "least_inflight",
            Strategy::P2cEwma => "p2c_ewma",
            Strategy::Weighted => "weighted",
            Strategy::PrefixAffinity => "prefix_affinity",
        }
    }

    /// Strategies that pick the first candidate per request among equivalent ones.
    pub fn is_load_balancing(self) -> bool {
        matches!(
            self,
            Strategy::RoundRobin
                | Strategy::Random
                | Strategy::LeastInflight
                | Strategy::P2cEwma
                | Strategy::Weighted
                | Strategy::PrefixAffinity
        )
    }
}

/// A strategy a request's `routing.strategy` or a key's `routing.strategy` asks for: any name
/// [`Strategy::parse`] accepts, or `smart`, not yet a strategy of its own and taken as
/// `priority_cheapest` (seed 002). One parser, so a key accepts exactly what a request may ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AskedStrategy {
    pub strategy: Strategy,
    /// `smart` was asked for (reported as `reason=smart_fallback`).
    pub smart_fallback: bool,
}

impl AskedStrategy {
    pub fn parse(name: &str) -> Option<Self> {
        if name == "smart" {
            return Some(Self {
                strategy: Strategy::PriorityCheapest,
                smart_fallback: true,
            });
        }
        Strategy::parse(name).map(|strategy| Self {
            strategy,
            smart_fallback: false,
        })
    }

    /// What a strategy that was asked for is written as (`smart` stays `smart`).
    pub fn as_str(self) -> &'static str {
        if self.smart_fallback {
            "smart"
        } else {
            self.strategy.as_str()
        }
    }
}

/// Blend weights of the scored strategies (`w_r·reliability + w_s·speed + w_c·capability`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Weights {
    pub reliability: f64,
    pub speed: f64,
    pub capability: f64,
}

impl Weights {
    pub const BALANCED: Weights = Weights {
        reliability: 0.5,
        speed: 0.25,
        capability: 0.25,
    };
    pub const SMARTEST: Weights = Weights {
        reliability: 0.2,
        speed: 0.1,
        capability: 0.7,
    };
}

/// How log lines are written (`log.format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// `key=value` fields after the message, one line per event.
    Text,
    /// One JSON object per line, the event's fields at the top level.
    Json,
}

impl LogFormat {
    pub const ALL: [LogFormat; 2] = [LogFormat::Text, LogFormat::Json];

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "text" => Some(LogFormat::Text),
            "json" => Some(LogFormat::Json),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

/// A capability a model may declare (`models.<name>.capabilities`).
#[derive(Debug, Deserialize, Clone, Copy, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum CapabilitySection {
    Stream,
    Tools,
    Vision,
    JsonMode,
}

/// How a provider picks among its credentials (`providers.<id>.credential_choice`), apart from
/// how candidates are ranked (seed 000).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CredentialChoice {
    /// Each request starts at the next usable key.
    #[default]
    RoundRobin,
    /// The usable key with the least quota left by the provider's own rate-limit headers
    /// (`x-ratelimit-remaining-*`, `anthropic-ratelimit-*-remaining`) goes first: one key's
    /// window is spent before the next is touched, so the others stay whole for a burst. A
    /// key the provider reports at 0 rests until its reset; a key with no fresh reading
    /// counts as full.
    LeastRemainingQuota,
}

impl CredentialChoice {
    /// The names a file may use.
    pub const NAMES: &'static str = "round_robin, least_remaining_quota";

    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "round_robin" => Some(Self::RoundRobin),
            "least_remaining_quota" => Some(Self::LeastRemainingQuota),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::RoundRobin => "round_robin",
            Self::LeastRemainingQuota => "least_remaining_quota",
        }
    }
}
