//! Side inputs served over the Fn State API: the runner indexes a side input's materialized
//! elements by window (and by key for multimaps), and answers the harness's reads from there, a
//! page of whole elements at a time (the rest behind a continuation token, as Beam's State API
//! pages large values); and a stateful DoFn's user state (bags, ordered lists), read in pages
//! the same way.
use crate::execute::checkpoint::{BagState, ListState, StateId};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use prost::bytes::Bytes;

use crate::coders::{Shape, Windowed, read_varint};
use crate::error::PortableError;
use crate::fn_api::{
    StateAppendResponse, StateClearResponse, StateGetResponse, StateRequest, StateResponse,
    state_key, state_request, state_response,
};

/// What a bundle's State API requests are answered from: its stage's side inputs, and (for a
/// stateful DoFn) the user state of the keys it holds.
#[derive(Clone, Default)]
pub struct BundleState {
    pub side_inputs: Option<Arc<SideInputStore>>,
    pub user: Option<Arc<UserState>>,
}

impl BundleState {
    pub fn answer(&self, request: &StateRequest) -> StateResponse {
        let user_key = matches!(
            request.state_key.as_ref().and_then(|k| k.r#type.as_ref()),
            Some(state_key::Type::BagUserState(_) | state_key::Type::OrderedListUserState(_))
        );
        match (&self.user, &self.side_inputs) {
            (Some(user), _) if user_key => user.answer(request),
            (_, Some(side)) => side.answer(request),
            _ => StateResponse {
                id: request.id.clone(),
                error: "this bundle has no side inputs and no user state".into(),
                response: None,
            },
        }
    }
}

/// A stateful DoFn's bags and ordered lists, by (transform, state id, window, key): each bundle
/// of a keyed stage holds all of its keys' elements, and its timers run in bundles after it with
/// the same state, so the state lives as long as that chain of bundles (and is dropped if it
/// fails). (transform id, state id, encoded window, encoded key).
type BagKey = (String, String, Vec<u8>, Vec<u8>);

fn state_id((transform, state, window, key): &BagKey) -> StateId {
    StateId {
        transform: transform.clone(),
        state: state.clone(),
        window: window.clone(),
        key: key.clone(),
    }
}

fn bag_key(id: Option<StateId>) -> Result<BagKey, String> {
    let id = id.ok_or("a saved user state without its id")?;
    Ok((id.transform, id.state, id.window, id.key))
}

/// An ordered list: by sort key (µs), each element as the SDK encoded it (the sort key as a
/// varint, then the length-prefixed value), in the order they were added.
type OrderedList = BTreeMap<i64, Vec<Vec<u8>>>;

/// A bag is kept as its elements when the runner can walk the state's coder, else as its
/// appends (each whole elements: the SDK appends what a bundle added), and read a page at a
/// time cut between them: a page holds elements (or appends) up to `page_bytes`, at least one.
/// An ordered list's read is cut between its elements.
pub struct UserState {
    bags: Mutex<HashMap<BagKey, Elements>>,
    lists: Mutex<HashMap<BagKey, OrderedList>>,
    /// The element shape of each bag-backed state the runner can walk, by (transform, state).
    shapes: HashMap<(String, String), Shape>,
    page_bytes: usize,
}

impl Default for UserState {
    fn default() -> Self {
        UserState {
            bags: Mutex::default(),
            lists: Mutex::default(),
            shapes: HashMap::new(),
            page_bytes: STATE_PAGE_BYTES,
        }
    }
}

impl UserState {
    /// The user state of a stateful stage whose bags of these (transform, state, element
    /// shape) are read in pages between elements.
    pub fn with_bags(bags: &[(String, String, Shape)]) -> UserState {
        UserState {
            shapes: bags
                .iter()
                .map(|(t, s, shape)| ((t.clone(), s.clone()), shape.clone()))
                .collect(),
            ..UserState::default()
        }
    }

    /// A copy to run a chain of bundles on: kept if the chain succeeds, dropped (with what it
    /// wrote) if it fails and is retried.
    pub fn snapshot(&self) -> UserState {
        UserState {
            bags: Mutex::new(self.bags.lock().expect("bags").clone()),
            lists: Mutex::new(self.lists.lock().expect("lists").clone()),
            shapes: self.shapes.clone(),
            page_bytes: self.page_bytes,
        }
    }

    /// Its bags and ordered lists, for a checkpoint.
    pub(crate) fn save(&self) -> (Vec<BagState>, Vec<ListState>) {
        let bags = self.bags.lock().expect("bags");
        let lists = self.lists.lock().expect("lists");
        let bags = bags
            .iter()
            .map(|(key, e)| BagState {
                id: Some(state_id(key)),
                data: e.data.clone(),
                ends: e.ends.iter().map(|&n| n as u64).collect(),
            })
            .collect();
        let lists = lists
            .iter()
            .map(|(key, list)| {
                let (sort_keys, elements) = list
                    .iter()
                    .flat_map(|(k, es)| es.iter().map(move |e| (*k, e.clone())))
                    .unzip();
                ListState {
                    id: Some(state_id(key)),
                    sort_keys,
                    elements,
                }
            })
            .collect();
        (bags, lists)
    }

    /// Adds what a checkpoint saved (to a fresh state).
    pub(crate) fn restore(&self, bags: Vec<BagState>, lists: Vec<ListState>) -> Result<(), String> {
        let mut mine = self.bags.lock().expect("bags");
        for b in bags {
            let key = bag_key(b.id)?;
            let ends: Vec<usize> = b.ends.iter().map(|&n| n as usize).collect();
            if ends.windows(2).any(|w| w[0] > w[1])
                || ends.last().is_some_and(|&e| e != b.data.len())
            {
                return Err(format!("the bag '{}' of '{}' is cut wrong", key.1, key.0));
            }
            mine.insert(key, Elements { data: b.data, ends });
        }
        let mut mine = self.lists.lock().expect("lists");
        for l in lists {
            let key = bag_key(l.id)?;
            if l.sort_keys.len() != l.elements.len() {
                return Err(format!(
                    "the ordered list '{}' of '{}' is cut wrong",
                    key.1, key.0
                ));
            }
            let list = mine.entry(key).or_default();
            for (k, e) in l.sort_keys.into_iter().zip(l.elements) {
                list.entry(k).or_default().push(e);
            }
        }
        Ok(())
    }

    /// Drops the state of every window `expired` says is over (by its encoded window, as the
    /// SDK keys state); how many states went.
    pub fn drop_windows(&self, expired: impl Fn(&[u8]) -> bool) -> usize {
        let mut bags = self.bags.lock().expect("bags");
        let mut lists = self.lists.lock().expect("lists");
        let before = bags.len() + lists.len();
        bags.retain(|(_, _, window, _), _| !expired(window));
        lists.retain(|(_, _, window, _), _| !expired(window));
        before - bags.len() - lists.len()
    }

    fn answer(&self, request: &StateRequest) -> StateResponse {
        let response = match request.state_key.as_ref().and_then(|k| k.r#type.as_ref()) {
            Some(state_key::Type::BagUserState(k)) => self.bag(
                (
                    k.transform_id.clone(),
                    k.user_state_id.clone(),
                    k.window.clone(),
                    k.key.clone(),
                ),
                request,
            ),
            Some(state_key::Type::OrderedListUserState(k)) => self.ordered_list(
                (
                    k.transform_id.clone(),
                    k.user_state_id.clone(),
                    k.window.clone(),
                    k.key.clone(),
                ),
                k.range.as_ref().map(|r| (r.start, r.end)),
                request,
            ),
            _ => unreachable!("routed here for user state only"),
        };
        match response {
            Ok(response) => StateResponse {
                id: request.id.clone(),
                error: String::new(),
                response: Some(response),
            },
            Err(error) => StateResponse {
                id: request.id.clone(),
                error,
                response: None,
            },
        }
    }

    fn bag(&self, key: BagKey, request: &StateRequest) -> Result<state_response::Response, String> {
        let mut bags = self.bags.lock().expect("bags");
        Ok(match &request.request {
            Some(state_request::Request::Get(get)) => {
                let from = offset(&get.continuation_token)?;
                let (data, next) = match bags.get(&key) {
                    Some(bag) => bag.page(from, self.page_bytes)?,
                    None if from == 0 => (Vec::new(), None),
                    None => return Err(format!("continuation token {from} is past the end")),
                };
                state_response::Response::Get(StateGetResponse {
                    continuation_token: token(next),
                    data,
                })
            }
            Some(state_request::Request::Append(a)) => {
                // Element by element when the shape parses the append to its end; an append
                // that does not (an SDK coder other than the pipeline's) is kept whole.
                let elements = self
                    .shapes
                    .get(&(key.0.clone(), key.1.clone()))
                    .and_then(|shape| shape.split(&a.data).ok());
                let bag = bags.entry(key).or_default();
                match elements {
                    Some(elements) => elements.into_iter().for_each(|e| bag.push(e)),
                    None => bag.push(&a.data),
                }
                state_response::Response::Append(StateAppendResponse {})
            }
            Some(state_request::Request::Clear(_)) => {
                bags.remove(&key);
                state_response::Response::Clear(StateClearResponse {})
            }
            None => return Err("an empty state request".into()),
        })
    }

    /// An ordered list's requests, each over the sort keys in `range` (`[start, end)`; all of
    /// them without one): a read gives its elements in sort-key order.
    fn ordered_list(
        &self,
        key: BagKey,
        range: Option<(i64, i64)>,
        request: &StateRequest,
    ) -> Result<state_response::Response, String> {
        let (start, end) = range.unwrap_or((i64::MIN, i64::MAX));
        let mut lists = self.lists.lock().expect("ordered lists");
        Ok(match &request.request {
            Some(state_request::Request::Get(get)) => {
                // The range's elements from the token's on (their index in the range), whole,
                // up to a page (at least one).
                let from = offset(&get.continuation_token)?;
                let mut elements = lists
                    .get(&key)
                    .filter(|_| start < end)
                    .into_iter()
                    .flat_map(|list| list.range(start..end).flat_map(|(_, e)| e))
                    .skip(from)
                    .peekable();
                let (mut data, mut next) = (Vec::new(), from);
                while let Some(e) = elements.next_if(|e| {
                    data.is_empty() || data.len().saturating_add(e.len()) <= self.page_bytes
                }) {
                    data.extend_from_slice(e);
                    next += 1;
                }
                let more = elements.peek().is_some();
                if data.is_empty() && from > 0 && !more {
                    return Err(format!("continuation token {from} is past the end"));
                }
                state_response::Response::Get(StateGetResponse {
                    continuation_token: token(more.then_some(next)),
                    data,
                })
            }
            Some(state_request::Request::Append(a)) => {
                // Every element read before any is kept: a torn append changes nothing.
                let (mut pos, mut added) = (0, vec![]);
                while pos < a.data.len() {
                    let (sort_key, at) = read_varint(&a.data, pos).map_err(|e| e.to_string())?;
                    let (len, at) = read_varint(&a.data, at).map_err(|e| e.to_string())?;
                    let next = at
                        .checked_add(len as usize)
                        .filter(|&n| n <= a.data.len())
                        .ok_or("an ordered list element runs past its append")?;
                    added.push((sort_key as i64, a.data[pos..next].to_vec()));
                    pos = next;
                }
                let list = lists.entry(key).or_default();
                for (sort_key, element) in added {
                    list.entry(sort_key).or_default().push(element);
                }
                state_response::Response::Append(StateAppendResponse {})
            }
            Some(state_request::Request::Clear(_)) => {
                if let Some(list) = lists.get_mut(&key) {
                    list.retain(|k, _| !(start..end).contains(k));
                }
                state_response::Response::Clear(StateClearResponse {})
            }
            None => return Err("an empty state request".into()),
        })
    }
}

/// Bytes of a side input's elements in one State response: the SDK reads the next page with
/// the continuation token, so neither side holds a large side input in one message.
pub const STATE_PAGE_BYTES: usize = 4 << 20;

/// The side inputs of one stage, by (transform id, local tag).
pub struct SideInputStore {
    inputs: HashMap<(String, String), SideData>,
    page_bytes: usize,
}

impl Default for SideInputStore {
    fn default() -> Self {
        SideInputStore {
            inputs: HashMap::new(),
            page_bytes: STATE_PAGE_BYTES,
        }
    }
}

#[derive(Default)]
struct SideData {
    /// Every value's encoding, per encoded window.
    values: HashMap<Vec<u8>, Elements>,
    /// For a multimap: per window, the keys in arrival order and each key's values.
    keyed: HashMap<Vec<u8>, Keyed>,
}

#[derive(Default)]
struct Keyed {
    order: Vec<Vec<u8>>,
    values: HashMap<Vec<u8>, (u32, Elements)>,
}

/// Encoded elements, concatenated, and where each ends: a page is cut between two of them
/// (the SDK decodes each page on its own).
#[derive(Default, Clone)]
struct Elements {
    data: Vec<u8>,
    ends: Vec<usize>,
}

impl Elements {
    fn push(&mut self, element: &[u8]) {
        self.data.extend_from_slice(element);
        self.ends.push(self.data.len());
    }

    /// The page that starts at element `first`: whole elements up to `page_bytes` (at least
    /// one), and the element the next page starts at, if any. (By element, not byte: an
    /// element may encode to nothing.)
    fn page(&self, first: usize, page_bytes: usize) -> Result<(Vec<u8>, Option<usize>), String> {
        if first > self.ends.len() {
            return Err(format!("continuation token {first} is past the end"));
        }
        let start = first.checked_sub(1).map_or(0, |i| self.ends[i]);
        let last = self
            .ends
            .partition_point(|&end| end <= start.saturating_add(page_bytes))
            .max((first + 1).min(self.ends.len()));
        let to = last.checked_sub(1).map_or(0, |i| self.ends[i]);
        let next = (last < self.ends.len()).then_some(last);
        Ok((self.data[start..to].to_vec(), next))
    }
}

/// A continuation token: the index of the next page's first element.
fn token(next: Option<usize>) -> Vec<u8> {
    next.map(|n| (n as u64).to_be_bytes().to_vec())
        .unwrap_or_default()
}

fn offset(token: &[u8]) -> Result<usize, String> {
    match token {
        [] => Ok(0),
        t => <[u8; 8]>::try_from(t)
            .map(|b| u64::from_be_bytes(b) as usize)
            .map_err(|_| "a continuation token this runner did not give".to_string()),
    }
}

impl SideInputStore {
    /// Indexes side input `tag` of `transform` from its encoded elements (`shape` is the
    /// PCollection's windowed-value shape).
    pub fn add(
        &mut self,
        transform: &str,
        tag: &str,
        shape: &Shape,
        blocks: &[Bytes],
        multimap: bool,
    ) -> Result<(), PortableError> {
        let mut data = SideData::default();
        // A multimap's elements are split into key and value; an iterable's are kept whole.
        let key_shape = match (multimap, shape.windowed_kv()) {
            (false, _) => None,
            (true, Some((key, _))) => Some(key),
            (true, None) => {
                return Err(PortableError::Malformed(format!(
                    "multimap side input '{tag}' is not of key-value pairs"
                )));
            }
        };
        for block in blocks {
            let mut pos = 0;
            while pos < block.len() {
                let wv = Windowed::read(shape, block, pos)?;
                pos = wv.end;
                for w in &wv.windows {
                    data.values.entry(w.to_vec()).or_default().push(wv.value);
                    let Some(key_shape) = key_shape else {
                        continue;
                    };
                    let split = key_shape.skip(wv.value, 0)?;
                    let (key, value) = wv.value.split_at(split);
                    let keyed = data.keyed.entry(w.to_vec()).or_default();
                    let slot = keyed.values.entry(key.to_vec()).or_insert_with(|| {
                        keyed.order.push(key.to_vec());
                        (0, Elements::default())
                    });
                    slot.0 += 1;
                    slot.1.push(value);
                }
            }
        }
        self.inputs
            .insert((transform.to_string(), tag.to_string()), data);
        Ok(())
    }

    pub fn answer(&self, request: &StateRequest) -> StateResponse {
        let reply = |result: Result<(Vec<u8>, Option<usize>), String>| match result {
            Ok((data, next)) => StateResponse {
                id: request.id.clone(),
                error: String::new(),
                response: Some(state_response::Response::Get(StateGetResponse {
                    continuation_token: token(next),
                    data,
                })),
            },
            Err(error) => StateResponse {
                id: request.id.clone(),
                error,
                response: None,
            },
        };
        let Some(state_request::Request::Get(get)) = &request.request else {
            return reply(Err(
                "Riverbank's portable runner keeps no user state yet: only side inputs are read"
                    .into(),
            ));
        };
        let from = match offset(&get.continuation_token) {
            Ok(from) => from,
            Err(e) => return reply(Err(e)),
        };
        let page = |elements: Option<&Elements>| match elements {
            Some(e) => e.page(from, self.page_bytes),
            None if from == 0 => Ok((Vec::new(), None)),
            None => Err(format!("continuation token {from} is past the end")),
        };
        let key = request.state_key.as_ref().and_then(|k| k.r#type.as_ref());
        reply(match key {
            Some(state_key::Type::IterableSideInput(k)) => self
                .find(&k.transform_id, &k.side_input_id)
                .and_then(|d| page(d.values.get(&k.window))),
            Some(state_key::Type::MultimapSideInput(k)) => {
                self.find(&k.transform_id, &k.side_input_id).and_then(|d| {
                    page(
                        d.keyed
                            .get(&k.window)
                            .and_then(|m| m.values.get(&k.key))
                            .map(|(_, v)| v),
                    )
                })
            }
            Some(state_key::Type::MultimapKeysSideInput(k)) => {
                self.find(&k.transform_id, &k.side_input_id).and_then(|d| {
                    let mut keys = Elements::default();
                    for key in d.keyed.get(&k.window).map(|m| &m.order[..]).unwrap_or(&[]) {
                        keys.push(key);
                    }
                    page(Some(&keys))
                })
            }
            Some(state_key::Type::MultimapKeysValuesSideInput(k)) => {
                self.find(&k.transform_id, &k.side_input_id).and_then(|d| {
                    // Each element: the key, its value count, its values.
                    let mut entries = Elements::default();
                    if let Some(m) = d.keyed.get(&k.window) {
                        for key in &m.order {
                            let (count, values) = &m.values[key];
                            let mut entry = key.clone();
                            entry.extend_from_slice(&(*count as i32).to_be_bytes());
                            entry.extend_from_slice(&values.data);
                            entries.push(&entry);
                        }
                    }
                    page(Some(&entries))
                })
            }
            other => Err(format!(
                "Riverbank's portable runner does not serve state of kind {other:?}"
            )),
        })
    }

    fn find(&self, transform: &str, tag: &str) -> Result<&SideData, String> {
        self.inputs
            .get(&(transform.to_string(), tag.to_string()))
            .ok_or_else(|| format!("transform '{transform}' has no side input '{tag}'"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coders::write_varint;
    use crate::fn_api::{OrderedListRange, StateAppendRequest, StateGetRequest, StateKey};

    fn request(range: Option<(i64, i64)>, request: state_request::Request) -> StateRequest {
        StateRequest {
            id: "r".into(),
            state_key: Some(StateKey {
                r#type: Some(state_key::Type::OrderedListUserState(
                    state_key::OrderedListUserState {
                        transform_id: "t".into(),
                        user_state_id: "list".into(),
                        window: vec![],
                        key: b"k".to_vec(),
                        range: range.map(|(start, end)| OrderedListRange { start, end }),
                    },
                )),
            }),
            request: Some(request),
            ..Default::default()
        }
    }

    /// An ordered list's elements, as the SDK encodes them: the sort key as a varint (two's
    /// complement for a negative one), then the length-prefixed value.
    fn elements(items: &[(i64, &str)]) -> Vec<u8> {
        let mut out = vec![];
        for (k, v) in items {
            write_varint(&mut out, *k as u64);
            write_varint(&mut out, v.len() as u64);
            out.extend_from_slice(v.as_bytes());
        }
        out
    }

    fn get(state: &UserState, range: Option<(i64, i64)>) -> Vec<u8> {
        let get = state_request::Request::Get(StateGetRequest::default());
        match state.answer(&request(range, get)).response {
            Some(state_response::Response::Get(g)) => g.data,
            other => panic!("{other:?}"),
        }
    }

    /// A window's state goes when its window expires; another window's, and the ordered
    /// lists of a window that has not expired, stay.
    #[test]
    fn the_state_of_expired_windows_is_dropped_and_no_other() {
        let state = UserState::default();
        let bag = |window: &[u8], request: state_request::Request| StateRequest {
            id: "r".into(),
            state_key: Some(StateKey {
                r#type: Some(state_key::Type::BagUserState(state_key::BagUserState {
                    transform_id: "t".into(),
                    user_state_id: "bag".into(),
                    window: window.to_vec(),
                    key: b"k".to_vec(),
                })),
            }),
            request: Some(request),
            ..Default::default()
        };
        let append = || {
            state_request::Request::Append(StateAppendRequest {
                data: b"\x01v".to_vec(),
            })
        };
        state.answer(&bag(b"old", append()));
        state.answer(&bag(b"new", append()));
        let list = state_request::Request::Append(StateAppendRequest {
            data: elements(&[(1, "x")]),
        });
        state.answer(&request(None, list));
        assert_eq!(state.drop_windows(|w| w == b"old"), 1);
        let read = |window: &[u8]| {
            let get = state_request::Request::Get(StateGetRequest::default());
            match state.answer(&bag(window, get)).response {
                Some(state_response::Response::Get(g)) => g.data,
                other => panic!("{other:?}"),
            }
        };
        assert!(read(b"old").is_empty());
        assert_eq!(read(b"new"), b"\x01v");
        assert_eq!(get(&state, None), elements(&[(1, "x")]));
    }

    /// A side input larger than a page goes in pages of whole elements (an empty one too),
    /// each behind the last one's continuation token, and together they are the whole.
    #[test]
    fn side_inputs_are_read_a_page_of_whole_elements_at_a_time() {
        let mut values = Elements::default();
        for e in ["a", "bb", "", "cccc", "d"] {
            values.push(e.as_bytes());
        }
        let mut store = SideInputStore {
            page_bytes: 3,
            ..Default::default()
        };
        store.inputs.insert(
            ("t".into(), "side".into()),
            SideData {
                values: HashMap::from([(vec![], values)]),
                ..Default::default()
            },
        );
        let read = |token: Vec<u8>| {
            let request = StateRequest {
                id: "r".into(),
                state_key: Some(StateKey {
                    r#type: Some(state_key::Type::IterableSideInput(
                        state_key::IterableSideInput {
                            transform_id: "t".into(),
                            side_input_id: "side".into(),
                            window: vec![],
                        },
                    )),
                }),
                request: Some(state_request::Request::Get(StateGetRequest {
                    continuation_token: token,
                })),
                ..Default::default()
            };
            store.answer(&request)
        };
        let (mut pages, mut token) = (vec![], vec![]);
        loop {
            let answer = read(token);
            let Some(state_response::Response::Get(get)) = answer.response else {
                panic!("{}", answer.error);
            };
            pages.push(String::from_utf8(get.data).unwrap());
            if get.continuation_token.is_empty() {
                break;
            }
            token = get.continuation_token;
        }
        assert_eq!(
            pages,
            ["abb", "cccc", "d"],
            "at most 3 bytes, or one element"
        );
        assert!(read(vec![1, 2]).error.contains("did not give"));
        assert!(
            read(99u64.to_be_bytes().to_vec())
                .error
                .contains("past the end")
        );
    }

    /// Every page of a user state read, following the continuation tokens: (pages, error).
    fn pages(state: &UserState, key: state_key::Type) -> (Vec<Vec<u8>>, String) {
        let (mut pages, mut token) = (vec![], vec![]);
        loop {
            let answer = state.answer(&StateRequest {
                id: "r".into(),
                state_key: Some(StateKey {
                    r#type: Some(key.clone()),
                }),
                request: Some(state_request::Request::Get(StateGetRequest {
                    continuation_token: token,
                })),
                ..Default::default()
            });
            let Some(state_response::Response::Get(get)) = answer.response else {
                return (pages, answer.error);
            };
            pages.push(get.data);
            if get.continuation_token.is_empty() {
                return (pages, String::new());
            }
            token = get.continuation_token;
        }
    }

    fn bag_key(state_id: &str) -> state_key::Type {
        state_key::Type::BagUserState(state_key::BagUserState {
            transform_id: "t".into(),
            user_state_id: state_id.into(),
            window: vec![],
            key: b"k".to_vec(),
        })
    }

    fn append(state: &UserState, key: state_key::Type, data: &[u8]) -> StateResponse {
        state.answer(&StateRequest {
            id: "r".into(),
            state_key: Some(StateKey { r#type: Some(key) }),
            request: Some(state_request::Request::Append(StateAppendRequest {
                data: data.to_vec(),
            })),
            ..Default::default()
        })
    }

    /// A bag larger than a page is read in pages cut between its appends, an ordered list's
    /// range in pages cut between its elements; together they are the whole.
    #[test]
    fn bags_and_ordered_lists_are_read_a_page_at_a_time() {
        let state = UserState {
            page_bytes: 4,
            ..Default::default()
        };
        let bag = bag_key("bag");
        assert_eq!(pages(&state, bag.clone()), (vec![vec![]], String::new()));
        for data in ["ab", "c", "defgh", "i"] {
            append(&state, bag.clone(), data.as_bytes());
        }
        let (got, error) = pages(&state, bag);
        assert_eq!(error, "");
        let got: Vec<String> = got
            .into_iter()
            .map(|p| String::from_utf8(p).unwrap())
            .collect();
        assert_eq!(got, ["abc", "defgh", "i"], "at most 4 bytes, or one append");

        for (k, v) in [(5, "x"), (1, "yy"), (9, "z"), (3, "w")] {
            let append = StateAppendRequest {
                data: elements(&[(k, v)]),
            };
            state.answer(&request(None, state_request::Request::Append(append)));
        }
        let list = |range: Option<(i64, i64)>| {
            state_key::Type::OrderedListUserState(state_key::OrderedListUserState {
                transform_id: "t".into(),
                user_state_id: "list".into(),
                window: vec![],
                key: b"k".to_vec(),
                range: range.map(|(start, end)| OrderedListRange { start, end }),
            })
        };
        // Each element is 3 bytes (sort key, length, value) but `yy`'s 4.
        let (got, error) = pages(&state, list(None));
        assert_eq!(error, "");
        let want: Vec<Vec<u8>> = [(1, "yy"), (3, "w"), (5, "x"), (9, "z")]
            .iter()
            .map(|e| elements(&[*e]))
            .collect();
        assert_eq!(got, want);
        let (got, _) = pages(&state, list(Some((2, 9))));
        assert_eq!(got, want[1..3]);
        let (got, _) = pages(&state, list(Some((9, 2))));
        assert_eq!(got, [Vec::<u8>::new()]);
    }

    /// A bag whose coder the runner walks is paged between its elements, even within one
    /// append; an append its shape does not parse is kept whole.
    #[test]
    fn a_walkable_bag_is_paged_between_elements() {
        let state = UserState {
            page_bytes: 4,
            ..UserState::with_bags(&[("t".into(), "words".into(), Shape::Bytes)])
        };
        append(&state, bag_key("words"), b"\x03abc\x01d\x03efg");
        let (got, error) = pages(&state, bag_key("words"));
        assert_eq!(error, "");
        assert_eq!(got, [&b"\x03abc"[..], b"\x01d", b"\x03efg"]);
        // Cut short for its shape: kept as it came.
        append(&state, bag_key("words"), b"\x05ab");
        let (got, _) = pages(&state, bag_key("words"));
        assert_eq!(got.last().unwrap(), b"\x05ab");
    }

    #[test]
    fn ordered_lists_read_by_sort_key_and_refuse_a_torn_append() {
        let state = UserState::default();
        let append = |data: Vec<u8>| {
            state.answer(&request(
                None,
                state_request::Request::Append(StateAppendRequest { data }),
            ))
        };
        assert!(
            append(elements(&[(7, "c"), (-2, "a"), (7, "d"), (3, "b")]))
                .error
                .is_empty()
        );
        let all = elements(&[(-2, "a"), (3, "b"), (7, "c"), (7, "d")]);
        assert_eq!(get(&state, None), all);
        assert_eq!(get(&state, Some((0, 7))), elements(&[(3, "b")]));
        let clear = state_request::Request::Clear(Default::default());
        state.answer(&request(Some((-5, 4)), clear));
        assert_eq!(get(&state, None), elements(&[(7, "c"), (7, "d")]));
        let mut torn = elements(&[(1, "w"), (2, "xyz")]);
        torn.truncate(torn.len() - 1);
        let r = append(torn);
        assert!(r.error.contains("runs past"), "{}", r.error);
        assert_eq!(
            get(&state, None),
            elements(&[(7, "c"), (7, "d")]),
            "nothing of it kept"
        );
    }
}
