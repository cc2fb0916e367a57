//! How Riverbank holds elements in Arrow: a record batch of the user's fields beside hidden
//! event-time and window columns (`columns`), JSON rows in and out (`json_rows`), the
//! widening of differing types to one (`widen`), and Beam's `Any` for a field whose values keep
//! several types (`any`), values that are not rows (`bare`), UTC timestamps as JSON text
//! (`utc_json`). Every runtime crate speaks these.
pub mod any;
pub mod bare;
pub mod columns;
pub mod json_rows;
pub mod utc_json;
pub mod widen;
