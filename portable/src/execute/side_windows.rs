//! Side inputs that never end, in fixed windows (Beam's slowly updating side inputs: a
//! `PeriodicImpulse` windowed, mapped to what the main input needs): a main element reads the
//! side window that holds its own window's end (Beam's default window mapping), and waits,
//! held from round to round, until the watermark has passed that side window's end, so the
//! window is complete when it is read, as Beam's runners wait for a side input to be ready.
//! A side window that has ended is dropped once its round is over: a main element that needs
//! it later is late.
use crate::coders::{Interval, Shape, Windowed};
use crate::error::PortableError;

use super::group::max_timestamp;

/// A stage's side input from an unbounded PCollection in fixed windows of `size` millis from
/// `offset`.
#[derive(Debug, Clone)]
pub(super) struct SideWait {
    pub pcollection: String,
    pub size: i64,
    pub offset: i64,
}

impl SideWait {
    /// The end of the side window that holds `t`.
    fn end_of_window_at(&self, t: i64) -> i64 {
        let start = t - (t - self.offset).rem_euclid(self.size);
        start.saturating_add(self.size)
    }
}

/// Main-input elements (`shape`) cut into those whose side windows are complete at
/// `watermark`, and those that wait.
pub(super) fn ready(
    bytes: &[u8],
    shape: &Shape,
    waits: &[SideWait],
    watermark: i64,
) -> Result<(Vec<u8>, Vec<u8>), PortableError> {
    let Shape::WindowedValue { window, .. } = shape else {
        return Err(PortableError::Malformed(format!(
            "{shape:?} is not a windowed value"
        )));
    };
    let (mut go, mut wait) = (Vec::new(), Vec::new());
    let mut pos = 0;
    while pos < bytes.len() {
        let wv = Windowed::read(shape, bytes, pos)?;
        let mut complete = true;
        for w in &wv.windows {
            let t = max_timestamp(window, w)?;
            complete &= waits
                .iter()
                .all(|s| watermark == i64::MAX || s.end_of_window_at(t) <= watermark);
        }
        let to = if complete { &mut go } else { &mut wait };
        to.extend_from_slice(&bytes[pos..wv.end]);
        pos = wv.end;
    }
    Ok((go, wait))
}

/// A side input's elements (`shape`, in interval windows) less those whose windows ended at or
/// before `watermark`.
pub(super) fn unexpired(
    bytes: &[u8],
    shape: &Shape,
    watermark: i64,
) -> Result<Vec<u8>, PortableError> {
    let mut kept = Vec::with_capacity(bytes.len());
    let mut pos = 0;
    while pos < bytes.len() {
        let wv = Windowed::read(shape, bytes, pos)?;
        let mut live = false;
        for w in &wv.windows {
            live |= Interval::decode(w)?.end > watermark;
        }
        if live {
            kept.extend_from_slice(&bytes[pos..wv.end]);
        }
        pos = wv.end;
    }
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coders::write_windowed;

    fn shape() -> Shape {
        Shape::WindowedValue {
            value: Box::new(Shape::VarInt),
            window: Box::new(Shape::IntervalWindow),
        }
    }

    fn element(out: &mut Vec<u8>, value: u8, start: i64, end: i64) {
        let window = Interval { start, end }.encode();
        write_windowed(out, start, &[&window], &[0x0f], &[&[value]]);
    }

    #[test]
    fn a_main_element_waits_until_its_side_window_is_complete() {
        // Side windows of 10 s; main elements in 5-s windows.
        let waits = [SideWait {
            pcollection: "side".into(),
            size: 10_000,
            offset: 0,
        }];
        let mut main = Vec::new();
        element(&mut main, 1, 0, 5_000); // needs side window [0, 10 s)
        element(&mut main, 2, 10_000, 15_000); // needs [10 s, 20 s)
        let (go, wait) = ready(&main, &shape(), &waits, 12_000).unwrap();
        let (mut one, mut two) = (Vec::new(), Vec::new());
        element(&mut one, 1, 0, 5_000);
        element(&mut two, 2, 10_000, 15_000);
        assert_eq!((go, wait.clone()), (one, two.clone()));
        let (go, wait) = ready(&wait, &shape(), &waits, i64::MAX).unwrap();
        assert_eq!((go, wait), (two, vec![]));
    }

    #[test]
    fn side_windows_that_ended_are_dropped() {
        let mut side = Vec::new();
        element(&mut side, 1, 0, 10_000);
        element(&mut side, 2, 10_000, 20_000);
        let mut second = Vec::new();
        element(&mut second, 2, 10_000, 20_000);
        assert_eq!(unexpired(&side, &shape(), 10_000).unwrap(), second);
    }
}
