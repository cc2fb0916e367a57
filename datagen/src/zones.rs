//! A coarse synthetic geography of the 263 NYC TLC taxi zones.
//!
//! Real zone shapes are not needed: trips only need plausible distances and the
//! well-known demand skew (Midtown, the Upper East Side and the two airports on top).
//! Manhattan zones and the busiest outer-borough zones get hand-placed coordinates
//! (miles; x grows east, y grows north from the Battery); the long tail of outer zones
//! is scattered deterministically into rough borough boxes.

use std::sync::OnceLock;

use crate::rng::{Rng, mix64};

/// Highest TLC zone id we generate (264/265 are "unknown" in the real data).
pub(crate) const MAX_ZONE: usize = 263;
pub(crate) const JFK: u16 = 132;
pub(crate) const LGA: u16 = 138;
pub(crate) const EWR: u16 = 1;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Area {
    Manhattan,
    Outer,
    Airport,
}

/// (zone, x, y, pickup weight in percent of all pickups).
/// Weights follow the shape of January 2024 TLC data, with LaGuardia nudged up so the
/// top five (161, 237, 132, 236, 138) are stable even on small samples.
#[rustfmt::skip]
const MANHATTAN: &[(u16, f32, f32, f64)] = &[
    (12, 0.0, 0.0, 0.10), (13, -0.3, 0.5, 0.50), (261, -0.1, 0.6, 0.60), (88, 0.2, 0.2, 0.40),
    (87, 0.2, 0.6, 0.80), (209, 0.4, 0.6, 0.30), (231, -0.1, 1.1, 1.20), (45, 0.3, 1.2, 0.40),
    (232, 0.7, 1.2, 0.20), (144, 0.2, 1.5, 0.70), (211, -0.1, 1.5, 0.80), (125, -0.4, 1.4, 0.70),
    (148, 0.6, 1.6, 0.70), (114, 0.0, 1.9, 1.00), (4, 0.9, 2.0, 0.40), (79, 0.5, 2.1, 2.10),
    (249, -0.3, 2.1, 1.90), (158, -0.6, 2.4, 0.80), (113, 0.0, 2.3, 1.20), (234, 0.2, 2.5, 2.20),
    (224, 0.8, 2.6, 0.30), (107, 0.4, 2.9, 1.90), (68, -0.3, 2.8, 2.30), (246, -0.7, 3.2, 1.50),
    (90, 0.1, 3.0, 1.40), (137, 0.7, 3.2, 1.10), (186, -0.2, 3.4, 3.10), (164, 0.1, 3.5, 1.60),
    (170, 0.5, 3.5, 2.90), (100, -0.1, 3.7, 1.40), (233, 0.8, 3.9, 1.30), (162, 0.5, 4.0, 3.20),
    (161, 0.2, 4.1, 4.80), (230, -0.1, 4.0, 3.10), (48, -0.4, 4.1, 2.20), (50, -0.8, 4.0, 0.80),
    (229, 0.8, 4.4, 1.40), (163, 0.1, 4.5, 2.50), (143, -0.6, 4.9, 1.00), (142, -0.3, 4.9, 3.00),
    (43, 0.1, 5.6, 1.60), (237, 0.6, 4.9, 4.60), (141, 0.5, 5.3, 2.20), (140, 0.9, 5.3, 1.80),
    (202, 1.2, 4.9, 0.03), (239, -0.4, 5.5, 2.50), (263, 0.8, 5.8, 1.70), (262, 1.1, 5.9, 1.50),
    (236, 0.6, 6.0, 4.10), (238, -0.3, 6.3, 1.50), (24, -0.4, 6.9, 0.50), (151, -0.1, 6.9, 0.80),
    (75, 0.8, 6.8, 1.20), (74, 0.9, 7.5, 0.60), (166, -0.5, 7.4, 0.80), (41, 0.2, 7.6, 0.60),
    (194, 1.6, 7.5, 0.02), (152, -0.5, 8.0, 0.30), (42, 0.3, 8.5, 0.40), (116, -0.4, 8.9, 0.30),
    (244, -0.3, 9.8, 0.30), (120, 0.1, 10.0, 0.02), (243, -0.2, 10.8, 0.15), (127, 0.0, 11.6, 0.10),
    (128, -0.3, 11.9, 0.01), (153, 0.1, 12.2, 0.01), (103, -0.8, -0.8, 0.002),
    (104, -1.5, 0.2, 0.0005), (105, -1.4, 0.0, 0.001),
];

/// Airports: they are big zones, so their coordinates are the terminal areas.
#[rustfmt::skip]
const AIRPORTS: &[(u16, f32, f32, f64)] = &[
    (JFK, 10.0, -3.5, 4.50), (LGA, 5.5, 6.5, 3.80), (EWR, -10.0, -2.0, 0.01),
];

/// The outer-borough zones that show up daily in yellow-cab data.
#[rustfmt::skip]
const OUTER_KNOWN: &[(u16, f32, f32, f64)] = &[
    // Queens
    (7, 3.2, 6.0, 0.25), (70, 5.9, 6.2, 0.25), (145, 1.8, 3.9, 0.15), (146, 2.3, 4.6, 0.15),
    (179, 2.8, 6.8, 0.08), (223, 3.8, 6.5, 0.06), (226, 3.5, 4.5, 0.08), (260, 4.6, 4.6, 0.08),
    (129, 5.5, 5.5, 0.10), (82, 6.0, 4.8, 0.06), (92, 8.5, 5.8, 0.05), (93, 7.5, 5.0, 0.08),
    (95, 7.5, 3.2, 0.06), (28, 9.0, 2.0, 0.03), (130, 10.0, 1.5, 0.05), (10, 10.0, -1.5, 0.06),
    (216, 9.2, -1.8, 0.06), (56, 6.8, 5.2, 0.03), (57, 6.9, 5.4, 0.01),
    // Brooklyn
    (65, 1.0, 0.3, 0.08), (66, 0.9, 0.9, 0.10), (33, 0.5, 0.4, 0.08), (97, 1.6, 0.4, 0.05),
    (181, 1.3, -1.3, 0.06), (255, 2.2, 2.2, 0.10), (256, 1.9, 1.6, 0.08), (112, 2.4, 3.0, 0.07),
    (80, 3.0, 1.8, 0.05), (61, 3.0, -1.0, 0.04), (17, 2.5, 0.8, 0.03), (25, 0.9, -0.2, 0.04),
    (49, 2.0, 0.6, 0.03), (189, 2.0, -0.8, 0.03), (40, 0.4, -0.6, 0.04), (14, -1.0, -5.5, 0.01),
    (89, 2.0, -4.0, 0.02),
    // Bronx
    (168, 1.5, 8.0, 0.05), (69, 1.8, 9.3, 0.04), (247, 1.3, 9.4, 0.03), (159, 1.9, 8.6, 0.02),
];

/// Borough boxes (x0, x1, y0, y1, share of the remaining zones) for the long tail.
#[rustfmt::skip]
const TAIL_BOXES: &[(f32, f32, f32, f32, u64)] = &[
    (0.0, 6.0, -7.0, 0.0, 35),   // Brooklyn
    (3.0, 14.0, -3.0, 8.0, 33),  // Queens
    (0.0, 7.0, 8.0, 15.0, 22),   // Bronx
    (-12.0, -5.0, -10.0, -3.0, 10), // Staten Island
];

/// Cumulative-weight sampler over zone ids.
pub(crate) struct Cdf {
    ids: Vec<u16>,
    cum: Vec<f64>,
}

impl Cdf {
    fn new(items: impl IntoIterator<Item = (u16, f64)>) -> Self {
        let mut ids = Vec::new();
        let mut cum = Vec::new();
        let mut total = 0.0;
        for (id, w) in items {
            if w > 0.0 {
                total += w;
                ids.push(id);
                cum.push(total);
            }
        }
        // Normalise so sampling needs a single uniform in [0, 1).
        for c in &mut cum {
            *c /= total;
        }
        Cdf { ids, cum }
    }

    #[inline]
    pub(crate) fn sample(&self, rng: &mut Rng) -> u16 {
        let u = rng.f64();
        let i = self.cum.partition_point(|&c| c <= u);
        self.ids[i.min(self.ids.len() - 1)]
    }
}

pub(crate) struct Geo {
    area: [Area; MAX_ZONE + 1],
    pos: [(f32, f32); MAX_ZONE + 1],
    pub(crate) pickup: Cdf,
    pub(crate) drop_manhattan: Cdf,
    pub(crate) drop_outer: Cdf,
}

impl Geo {
    pub(crate) fn get() -> &'static Geo {
        static GEO: OnceLock<Geo> = OnceLock::new();
        GEO.get_or_init(Geo::build)
    }

    fn build() -> Geo {
        let mut area = [Area::Outer; MAX_ZONE + 1];
        let mut pos = [(0.0f32, 0.0f32); MAX_ZONE + 1];
        let mut weight = [0.0f64; MAX_ZONE + 1];
        let mut placed = [false; MAX_ZONE + 1];
        for (table, a) in [
            (MANHATTAN, Area::Manhattan),
            (AIRPORTS, Area::Airport),
            (OUTER_KNOWN, Area::Outer),
        ] {
            for &(z, x, y, w) in table {
                let z = usize::from(z);
                debug_assert!(!placed[z], "zone {z} listed twice");
                area[z] = a;
                pos[z] = (x, y);
                weight[z] = w;
                placed[z] = true;
            }
        }
        // Long tail: a fixed hash (independent of the user's seed) so geography is static.
        let share_total: u64 = TAIL_BOXES.iter().map(|b| b.4).sum();
        for z in 1..=MAX_ZONE {
            if placed[z] {
                continue;
            }
            let h = mix64(z as u64 ^ 0x7A7A_0000);
            let mut pick = h % share_total;
            let b = TAIL_BOXES
                .iter()
                .find(|b| {
                    if pick < b.4 {
                        true
                    } else {
                        pick -= b.4;
                        false
                    }
                })
                .unwrap_or(&TAIL_BOXES[0]);
            let fx = ((h >> 16) & 0xFFFF) as f32 / 65535.0;
            let fy = ((h >> 32) & 0xFFFF) as f32 / 65535.0;
            pos[z] = (b.0 + (b.1 - b.0) * fx, b.2 + (b.3 - b.2) * fy);
            // Log-uniform between 0.0004% and 0.03% of pickups: at ~77k trips/day a good
            // share of these expect under one pickup, which yields the ~230 distinct
            // pickup zones per day seen in real data.
            let fw = ((h >> 48) & 0xFFFF) as f64 / 65535.0;
            weight[z] = 0.0004 * (0.03f64 / 0.0004).powf(fw);
        }

        let pickup = Cdf::new((1..=MAX_ZONE).map(|z| (z as u16, weight[z])));
        let drop_manhattan = Cdf::new(
            (1..=MAX_ZONE)
                .filter(|&z| area[z] == Area::Manhattan)
                .map(|z| (z as u16, weight[z])),
        );
        // Drop-offs spread out more than pickups (residential areas), hence the flattening.
        let drop_outer = Cdf::new(
            (1..=MAX_ZONE)
                .filter(|&z| area[z] == Area::Outer)
                .map(|z| (z as u16, weight[z].powf(0.6))),
        );
        Geo {
            area,
            pos,
            pickup,
            drop_manhattan,
            drop_outer,
        }
    }

    #[inline]
    pub(crate) fn area(&self, z: u16) -> Area {
        self.area[usize::from(z)]
    }

    #[inline]
    pub(crate) fn pos(&self, z: u16) -> (f64, f64) {
        let (x, y) = self.pos[usize::from(z)];
        (f64::from(x), f64::from(y))
    }

    /// Manhattan south of 96th Street: the congestion-surcharge zone.
    #[inline]
    pub(crate) fn in_congestion_zone(&self, z: u16) -> bool {
        self.area(z) == Area::Manhattan && self.pos(z).1 < 6.3
    }

    fn dist(&self, a: u16, b: u16) -> f64 {
        let (ax, ay) = self.pos(a);
        let (bx, by) = self.pos(b);
        (ax - bx).hypot(ay - by)
    }

    /// Sample `k` candidates and keep the one nearest to `from`: a cheap way to make
    /// trips prefer nearby destinations without a full gravity model.
    fn nearest_of(&self, cdf: &Cdf, from: u16, k: usize, rng: &mut Rng) -> u16 {
        let mut best = cdf.sample(rng);
        let mut best_d = self.dist(from, best);
        for _ in 1..k {
            let c = cdf.sample(rng);
            let d = self.dist(from, c);
            if d < best_d {
                best = c;
                best_d = d;
            }
        }
        best
    }

    fn airport(rng: &mut Rng) -> u16 {
        let u = rng.f64();
        if u < 0.45 {
            JFK
        } else if u < 0.93 {
            LGA
        } else {
            EWR
        }
    }

    /// Drop-off zone conditional on the pickup zone's area.
    pub(crate) fn sample_dropoff(&self, pu: u16, rng: &mut Rng) -> u16 {
        let u = rng.f64();
        match self.area(pu) {
            Area::Manhattan => {
                if u < 0.03 {
                    pu
                } else if u < 0.84 {
                    self.nearest_of(&self.drop_manhattan, pu, 2, rng)
                } else if u < 0.89 {
                    Self::airport(rng)
                } else {
                    self.nearest_of(&self.drop_outer, pu, 3, rng)
                }
            }
            Area::Airport => {
                if u < 0.02 {
                    pu
                } else if u < 0.04 {
                    if pu == LGA { JFK } else { LGA }
                } else if u < 0.64 {
                    self.drop_manhattan.sample(rng)
                } else {
                    self.nearest_of(&self.drop_outer, pu, 2, rng)
                }
            }
            Area::Outer => {
                if u < 0.12 {
                    pu
                } else if u < 0.62 {
                    self.nearest_of(&self.drop_outer, pu, 4, rng)
                } else if u < 0.90 {
                    self.drop_manhattan.sample(rng)
                } else {
                    Self::airport(rng)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geography_is_complete() {
        let g = Geo::get();
        let manhattan = (1..=MAX_ZONE as u16)
            .filter(|&z| g.area(z) == Area::Manhattan)
            .count();
        // The TLC map has 69 Manhattan zones.
        assert_eq!(manhattan, MANHATTAN.len());
        assert_eq!(manhattan, 69);
        assert_eq!(g.pickup.ids.len(), MAX_ZONE);
        assert!(g.in_congestion_zone(161));
        assert!(!g.in_congestion_zone(JFK));
        assert!(g.in_congestion_zone(236));
        assert!(!g.in_congestion_zone(41));
    }
}
