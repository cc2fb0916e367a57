//! The steps of vertical (memory) autoscaling, shared by the operator (worker pods' memory) and
//! `riverbank run --workers` (local worker processes' memory limit), so both grow alike.

/// Memory grows by this factor a step (and shrinks by it).
pub const STEP: f64 = 1.5;
/// Sizes are whole multiples of this (128 MiB).
pub const GRAIN: u64 = 128 << 20;

/// A step up from `bytes`: ×[`STEP`], rounded up to the grain.
pub fn step_up(bytes: u64) -> u64 {
    round_up((bytes as f64 * STEP).ceil() as u64)
}

/// A step down from `bytes`: ÷[`STEP`], rounded up to the grain.
pub fn step_down(bytes: u64) -> u64 {
    round_up((bytes as f64 / STEP).ceil() as u64)
}

/// `bytes` rounded up to whole grains (at least one).
pub fn round_up(bytes: u64) -> u64 {
    bytes.div_ceil(GRAIN).max(1) * GRAIN
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_whole_grains() {
        assert_eq!(step_up(1 << 30), 1536 << 20);
        assert_eq!(step_up(64 << 20), 128 << 20);
        assert_eq!(step_up(200 << 20), 384 << 20);
        assert_eq!(step_down(1536 << 20), 1 << 30);
    }
}
