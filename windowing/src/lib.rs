//! Beam's event-time core, pure and clock-driven, so Beam's worked examples are its tests:
//! a trigger's state for one key and window (`trigger`), and the panes of that window
//! (`panes`: lateness, accumulation, `PaneInfo`, a compact encoding for state stores). The
//! caller holds the window's data and the clocks; both Riverbank's streaming runtime (YAML
//! pipelines, state in shards) and its Beam portable runner (SDK pipelines, state in the
//! runner) fire windows through it, so they fire alike.
pub mod panes;
pub mod trigger;

#[cfg(test)]
mod tests;
