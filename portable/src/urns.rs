//! The URNs Riverbank reads and writes (Beam's standard ones: `beam_runner_api.proto`).

// Transforms the runner executes itself.
pub const IMPULSE: &str = "beam:transform:impulse:v1";
pub const GROUP_BY_KEY: &str = "beam:transform:group_by_key:v1";
pub const FLATTEN: &str = "beam:transform:flatten:v1";
// A composite the runner lifts (Precombine, GroupByKey, MergeAccumulators, ExtractOutputs).
pub const COMBINE_PER_KEY: &str = "beam:transform:combine_per_key:v1";
pub const RESHUFFLE: &str = "beam:transform:reshuffle:v1";

// Transforms an SDK harness executes.
pub const PAR_DO: &str = "beam:transform:pardo:v1";
/// The SDK's side of a merging WindowFn the runner does not know (see `execute::merge_windows`).
pub const MERGE_WINDOWS: &str = "beam:transform:merge_windows:v1";
pub const READ: &str = "beam:transform:read:v1";
pub const TEST_STREAM: &str = "beam:transform:teststream:v1";
pub const COMBINE_PER_KEY_PRECOMBINE: &str = "beam:transform:combine_per_key_precombine:v1";
pub const COMBINE_PER_KEY_MERGE_ACCUMULATORS: &str =
    "beam:transform:combine_per_key_merge_accumulators:v1";
pub const COMBINE_PER_KEY_EXTRACT_OUTPUTS: &str =
    "beam:transform:combine_per_key_extract_outputs:v1";
pub const PAIR_WITH_RESTRICTION: &str = "beam:transform:sdf_pair_with_restriction:v1";
pub const SPLIT_AND_SIZE_RESTRICTIONS: &str = "beam:transform:sdf_split_and_size_restrictions:v1";
pub const PROCESS_SIZED_ELEMENTS_AND_RESTRICTIONS: &str =
    "beam:transform:sdf_process_sized_element_and_restrictions:v1";

// The data plane's ends of a fused stage.
pub const DATA_INPUT: &str = "beam:runner:source:v1";
pub const DATA_OUTPUT: &str = "beam:runner:sink:v1";

// Coders the runner can walk through; any other coder crosses stages inside a length prefix.
pub const BYTES: &str = "beam:coder:bytes:v1";
pub const STRING_UTF8: &str = "beam:coder:string_utf8:v1";
pub const VARINT: &str = "beam:coder:varint:v1";
pub const BOOL: &str = "beam:coder:bool:v1";
pub const DOUBLE: &str = "beam:coder:double:v1";
pub const KV: &str = "beam:coder:kv:v1";
pub const ITERABLE: &str = "beam:coder:iterable:v1";
pub const LENGTH_PREFIX: &str = "beam:coder:length_prefix:v1";
pub const GLOBAL_WINDOW: &str = "beam:coder:global_window:v1";
pub const INTERVAL_WINDOW: &str = "beam:coder:interval_window:v1";
pub const WINDOWED_VALUE: &str = "beam:coder:windowed_value:v1";
pub const NULLABLE: &str = "beam:coder:nullable:v1";
pub const TIMER: &str = "beam:coder:timer:v1";

// User state a stateful DoFn keeps (value, combining and set state are bags on the wire).
pub const BAG_USER_STATE: &str = "beam:user_state:bag:v1";
pub const ORDERED_LIST_USER_STATE: &str = "beam:user_state:ordered_list:v1";

// Window functions: sessions merge in the runner's GroupByKey (other merging ones on the SDK);
// the global one is that of the runner's own requests to the SDK.
pub const SESSION_WINDOWS: &str = "beam:window_fn:session_windows:v1";
pub const FIXED_WINDOWS: &str = "beam:window_fn:fixed_windows:v1";
pub const GLOBAL_WINDOWS: &str = "beam:window_fn:global_windows:v1";

// Side input access patterns.
pub const MULTIMAP_SIDE_INPUT: &str = "beam:side_input:multimap:v1";

// Environments.
pub const ENV_EXTERNAL: &str = "beam:env:external:v1";
pub const ENV_PROCESS: &str = "beam:env:process:v1";
pub const ENV_DOCKER: &str = "beam:env:docker:v1";

// Artifacts: how an artifact is had, and what it is to a harness.
pub const ARTIFACT_FILE: &str = "beam:artifact:type:file:v1";
pub const ARTIFACT_EMBEDDED: &str = "beam:artifact:type:embedded:v1";
pub const ARTIFACT_ROLE_STAGING_TO: &str = "beam:artifact:role:staging_to:v1";

// Metrics as monitoring infos: the SDK's element counts, and user metrics.
pub const ELEMENT_COUNT: &str = "beam:metric:element_count:v1";
/// A PCollection's element sizes, sampled by the SDK (an int64 distribution: count, sum, min,
/// max of the sampled elements' bytes).
pub const SAMPLED_BYTE_SIZE: &str = "beam:metric:sampled_byte_size:v1";
pub const USER_SUM_INT64: &str = "beam:metric:user:sum_int64:v1";
pub const USER_SUM_DOUBLE: &str = "beam:metric:user:sum_double:v1";
pub const USER_DISTRIBUTION_INT64: &str = "beam:metric:user:distribution_int64:v1";
pub const USER_DISTRIBUTION_DOUBLE: &str = "beam:metric:user:distribution_double:v1";
pub const USER_SET_STRING: &str = "beam:metric:user:set_string:v1";
