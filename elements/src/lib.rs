//! How Riverbank holds elements in Arrow: a record batch of the user's fields beside hidden
//! event-time and window columns (`columns`), JSON rows in and out (`json_rows`), and the
//! widening of differing types to one (`widen`). Every runtime crate speaks these.
pub mod columns;
pub mod json_rows;
pub mod widen;
