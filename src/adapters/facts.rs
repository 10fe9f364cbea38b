//! What routing reads from a caller's request, in no dialect's words: what the request needs
//! from a model ([`Needs`]), how hard it looks ([`Complexity`]), and the per-request `routing`
//! overrides ([`RoutingOverride`]). Each dialect derives them from its own body (`openai`,
//! `anthropic`); routing imports them from here, never from a dialect.

use serde::Deserialize;

/// What a request needs from the model that serves it, derived once from its body: a stream,
/// tools, vision (an image in the prompt), JSON mode (structured output). Each dialect's
/// request says which of its members count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Needs {
    pub stream: bool,
    pub tools: bool,
    pub vision: bool,
    pub json_mode: bool,
}

/// A request's complexity tier (the `complexity` router's input).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Complexity {
    Simple,
    Medium,
    Complex,
}

impl Complexity {
    /// The tier of a heuristic's points: 0 → simple, 1–2 → medium, 3 or more → complex.
    pub fn of_points(points: u32) -> Self {
        match points {
            0 => Complexity::Simple,
            1 | 2 => Complexity::Medium,
            _ => Complexity::Complex,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Complexity::Simple => "simple",
            Complexity::Medium => "medium",
            Complexity::Complex => "complex",
        }
    }
}

/// The per-request `routing` object: overrides for this request only.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RoutingOverride {
    #[serde(default)]
    pub strategy: Option<String>,
    #[serde(default)]
    pub providers: Option<Vec<String>>,
    #[serde(default)]
    pub policy: Option<String>,
}

/// The largest `routing.providers` list accepted.
pub const MAX_ROUTING_PROVIDERS: usize = 10;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_make_the_documented_tiers() {
        let tiers: Vec<_> = (0..5).map(Complexity::of_points).collect();
        assert_eq!(
            tiers,
            [
                Complexity::Simple,
                Complexity::Medium,
                Complexity::Medium,
                Complexity::Complex,
                Complexity::Complex
            ]
        );
    }
}
