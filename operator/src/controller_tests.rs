//! The reconciler against a mock API server (kube's `tower-test`, as in kube-rs' controller-rs):
//! every request a reconcile makes is taken in order and checked (method, path, field manager,
//! the essentials of its body) and answered as the API server would. A request the scenario
//! does not expect fails the test, and so does one it expects but never gets.
use super::*;
use crate::coordinator_client::{Coordinator, CoordinatorError};
use crate::crd::JobOptions;
use crate::crd::JobState;
use crate::crd::{DataflowJobStatus, DesiredState, StageStatus};
use crate::fixtures::{JobBuilder, progress};
use crate::lifecycle::{self, Replicas};
use crate::metrics::Metrics;
use crate::reconcile::{
    CLEANUP_RETRY, FIELD_MANAGER, FOLLOW_REQUEUE, STARTING_REQUEUE, next_action,
};
use crate::scaling::Clock;
use crate::settings::OperatorSettings;
use crate::status;
use futures::future::BoxFuture;
use http::{Method, Request, Response, request::Parts};
use k8s_openapi::jiff::SignedDuration;
use k8s_openapi::jiff::Timestamp;
use kube::client::Body;
use kube::runtime::events::Reporter;
use riverbank_pipeline::progress::{JobFailure, JobPhase, JobProgress};
use riverbank_pipeline::{SnapshotTaken, UpdateCheck, UpdateVerdict};
use serde_json::{Value, json};
use std::sync::Mutex;
use tokio::time::timeout;
use tower_test::mock::{self, Handle, SendResponse};

const NS: &str = "default";
const JOB_PATH: &str = "/apis/riverbank.dev/v1alpha1/namespaces/default/dataflowjobs/test";
const PLAN_PATH: &str = "/api/v1/namespaces/default/configmaps/test-plan";
const SERVICE_PATH: &str = "/api/v1/namespaces/default/services/test-headless";
const COORDINATOR_PATH: &str = "/apis/apps/v1/namespaces/default/statefulsets/test-coordinator";
const WORKERS_PATH: &str = "/apis/apps/v1/namespaces/default/statefulsets/test-worker";
const NETWORK_POLICY_PATH: &str =
    "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies/test";
const EVENTS_PATH: &str = "/apis/events.k8s.io/v1/namespaces/default/events";
const COORDINATOR_ADDRESS: &str = "test-coordinator-0.test-headless.default.svc.cluster.local:7070";

/// A coordinator that answers with whatever the test set (None: unreachable), and records what
/// it was asked. A cancel turns an active job Cancelled, unless it is stuck.
#[derive(Default)]
struct FakeCoordinator {
    progress: Mutex<Option<JobProgress>>,
    calls: Mutex<Vec<String>>,
    obeys_cancel: bool,
    /// The answer to an update check (None: compatible).
    refuses_update: Mutex<Option<String>>,
}

impl FakeCoordinator {
    fn answering(progress: Option<JobProgress>) -> Arc<Self> {
        Arc::new(FakeCoordinator {
            progress: Mutex::new(progress),
            calls: Mutex::default(),
            obeys_cancel: true,
            refuses_update: Mutex::default(),
        })
    }

    /// Answers, but never gets the job to a final phase.
    fn stuck(progress: JobProgress) -> Arc<Self> {
        Arc::new(FakeCoordinator {
            progress: Mutex::new(Some(progress)),
            calls: Mutex::default(),
            obeys_cancel: false,
            refuses_update: Mutex::default(),
        })
    }
    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

impl Coordinator for FakeCoordinator {
    fn status<'a>(
        &'a self,
        address: &'a str,
        wait: Option<Duration>,
    ) -> BoxFuture<'a, Result<JobProgress, CoordinatorError>> {
        let query = wait.map_or(String::new(), |w| format!("?wait_ms={}", w.as_millis()));
        self.calls
            .lock()
            .unwrap()
            .push(format!("GET {address}/v1/status{query}"));
        let answer =
            self.progress
                .lock()
                .unwrap()
                .clone()
                .ok_or_else(|| CoordinatorError::Unreachable {
                    address: address.into(),
                    reason: "connection refused".into(),
                });
        Box::pin(async move { answer })
    }

    fn cancel<'a>(&'a self, address: &'a str) -> BoxFuture<'a, Result<(), CoordinatorError>> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("POST {address}/v1/cancel"));
        let mut progress = self.progress.lock().unwrap();
        let answer = match progress.as_mut() {
            // What the coordinator does: a job not yet over is cancelled.
            Some(p) => {
                if !p.phase.is_terminal() && self.obeys_cancel {
                    p.phase = JobPhase::Cancelled;
                }
                Ok(())
            }
            None => Err(CoordinatorError::Unreachable {
                address: address.into(),
                reason: "connection refused".into(),
            }),
        };
        Box::pin(async move { answer })
    }

    fn sdk_workers<'a>(
        &'a self,
        address: &'a str,
        pools: &'a [String],
    ) -> BoxFuture<'a, Result<(), CoordinatorError>> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("POST {address}/v1/sdk-workers {}", pools.join(",")));
        Box::pin(async { Ok(()) })
    }

    fn drain<'a>(&'a self, address: &'a str) -> BoxFuture<'a, Result<(), CoordinatorError>> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("POST {address}/v1/job/drain"));
        if let Some(s) = self
            .progress
            .lock()
            .unwrap()
            .as_mut()
            .and_then(|p| p.streaming.as_mut())
        {
            s.draining = true;
        }
        Box::pin(async { Ok(()) })
    }

    fn snapshot<'a>(
        &'a self,
        address: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<SnapshotTaken, CoordinatorError>> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("POST {address}/v1/job/snapshot {name}"));
        let taken = self.take_snapshot(name);
        Box::pin(async move { Ok(taken) })
    }

    fn update_check<'a>(
        &'a self,
        address: &'a str,
        check: &'a UpdateCheck,
    ) -> BoxFuture<'a, Result<UpdateVerdict, CoordinatorError>> {
        self.calls.lock().unwrap().push(format!(
            "POST {address}/v1/job/update-check {}",
            check.plan.graph.transforms.len()
        ));
        let reason = self.refuses_update.lock().unwrap().clone();
        Box::pin(async move {
            Ok(UpdateVerdict {
                compatible: reason.is_none(),
                reason,
            })
        })
    }

    fn stop<'a>(
        &'a self,
        address: &'a str,
        snapshot: &'a str,
    ) -> BoxFuture<'a, Result<(), CoordinatorError>> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("POST {address}/v1/job/stop {snapshot}"));
        // Answered at once; the job stops after its checkpoint (`finish_stop`).
        Box::pin(async { Ok(()) })
    }
}

impl FakeCoordinator {
    /// What the coordinator does after a stop: the checkpoint ends, the state is kept as
    /// `snapshot`, the job ends.
    fn finish_stop(&self, snapshot: &str) {
        self.take_snapshot(snapshot);
        if let Some(p) = self.progress.lock().unwrap().as_mut() {
            p.phase = JobPhase::Cancelled;
            if let Some(s) = p.streaming.as_mut() {
                s.stopped = true;
            }
        }
    }

    fn take_snapshot(&self, name: &str) -> SnapshotTaken {
        let mut progress = self.progress.lock().unwrap();
        let s = progress
            .as_mut()
            .and_then(|p| p.streaming.as_mut())
            .expect("a streaming job's progress");
        let taken = SnapshotTaken {
            name: name.into(),
            checkpoint: s.checkpoint,
            location: format!("s3://bucket/tmp/test/snapshots/{name}"),
            taken_at: "2025-03-01T10:05:00Z".into(),
        };
        s.snapshots.push(taken.clone());
        taken
    }
}

/// A small valid job (Create → WriteToJson), 2 to 4 workers, with the operator's finalizer.
fn job() -> DataflowJob {
    JobBuilder::new("test")
        .numbers()
        .options(JobOptions {
            num_workers: Some(2),
            max_num_workers: Some(4),
            disk_size_gb: Some(10),
            ..Default::default()
        })
        .finalized()
        .build()
}

/// The job as a previous reconcile left it: Running, `ready` workers.
fn running_job(ready: i32) -> DataflowJob {
    let mut job = job();
    let plan = job.plan().unwrap();
    let mut s = status::planned_status(
        &job,
        status::Observed {
            stages: StageStatus::from_plan(&plan),
            target_workers: 2,
            progress: Some(Ok(progress(JobPhase::Running))),
            pod_problem: None,
            cancel: None,
            insights: crate::insights::Found::default(),
            autoscaling: None,
            memory: None,
            streaming: Default::default(),
            now: Timestamp::from_second(1_740_823_200).unwrap(),
        },
    );
    s.current_workers = Some(ready);
    job.status = Some(s);
    job
}

struct ApiServer(Handle<Request<Body>, Response<Body>>);

fn response(status: u16, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .body(Body::from(serde_json::to_vec(body).unwrap()))
        .unwrap()
}

fn query(parts: &Parts) -> Vec<String> {
    parts
        .uri
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(String::from)
        .collect()
}

fn content_type(parts: &Parts) -> &str {
    parts
        .headers
        .get("content-type")
        .map_or("", |v| v.to_str().unwrap())
}

/// Server-side apply with the operator's one field manager, taking ownership (force).
fn assert_ssa(parts: &Parts) {
    assert_eq!(parts.method, Method::PATCH, "{}", parts.uri);
    assert_eq!(content_type(parts), "application/apply-patch+yaml");
    let q = query(parts);
    assert!(
        q.contains(&"fieldManager=riverbank-operator".to_string()),
        "{q:?}"
    );
    assert!(q.contains(&"force=true".to_string()), "{q:?}");
}

impl ApiServer {
    async fn next(&mut self) -> (Parts, Value, SendResponse<Response<Body>>) {
        let (request, send) = timeout(Duration::from_secs(5), self.0.next_request())
            .await
            .expect("the reconciler made the expected request in time")
            .expect("the client is alive");
        let (parts, body) = request.into_parts();
        let bytes = body.collect_bytes().await.unwrap();
        let json = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap()
        };
        (parts, json, send)
    }

    /// A child applied: returns its body; answers with it plus `status`.
    async fn apply(&mut self, path: &str, status: Option<Value>) -> Value {
        let (parts, body, send) = self.next().await;
        assert_eq!(parts.uri.path(), path);
        assert_ssa(&parts);
        assert_eq!(
            body["metadata"]["ownerReferences"][0]["name"], "test",
            "{path}"
        );
        assert_eq!(body["metadata"]["ownerReferences"][0]["controller"], true);
        let mut reply = body.clone();
        if let Some(status) = status {
            reply["status"] = status;
        }
        send.send_response(response(200, &reply));
        body
    }

    /// The four children, in order; the workers' StatefulSet reports `ready` ready replicas.
    /// Returns (coordinator replicas, worker replicas).
    async fn apply_children(&mut self, ready: i32) -> (i64, i64) {
        let plan = self.apply(PLAN_PATH, None).await;
        assert_eq!(plan["kind"], "ConfigMap");
        assert!(
            plan["data"]["plan.json"]
                .as_str()
                .unwrap()
                .contains("Numbers")
        );
        let service = self.apply(SERVICE_PATH, None).await;
        assert_eq!(service["spec"]["clusterIP"], "None");
        let coordinator = self.apply(COORDINATOR_PATH, None).await;
        let workers = self
            .apply(
                WORKERS_PATH,
                Some(json!({"replicas": 2, "readyReplicas": ready})),
            )
            .await;
        assert_eq!(
            workers["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"],
            "10Gi"
        );
        (
            coordinator["spec"]["replicas"].as_i64().unwrap(),
            workers["spec"]["replicas"].as_i64().unwrap(),
        )
    }

    /// The status written through the status subresource (SSA); returns `status`.
    async fn status(&mut self) -> Value {
        let (parts, body, send) = self.next().await;
        assert_eq!(parts.uri.path(), format!("{JOB_PATH}/status"));
        assert_ssa(&parts);
        assert_eq!(body["apiVersion"], "riverbank.dev/v1alpha1");
        assert_eq!(body["kind"], "DataflowJob");
        assert!(body.get("spec").is_none(), "the operator never writes spec");
        let mut reply = serde_json::to_value(job()).unwrap();
        reply["status"] = body["status"].clone();
        send.send_response(response(200, &reply));
        body["status"].clone()
    }

    /// An Event about the job; returns (type, reason, note).
    async fn event(&mut self) -> (String, String, String) {
        let (parts, body, send) = self.next().await;
        assert_eq!(parts.method, Method::POST);
        assert_eq!(parts.uri.path(), EVENTS_PATH);
        assert_eq!(body["regarding"]["kind"], "DataflowJob");
        assert_eq!(body["regarding"]["name"], "test");
        assert_eq!(body["reportingController"], "riverbank-operator");
        send.send_response(response(201, &body));
        let text = |k: &str| body[k].as_str().unwrap_or_default().to_string();
        (text("type"), text("reason"), text("note"))
    }

    /// A StatefulSet scaled to zero: read, then its replicas alone server-side applied under
    /// the stop field manager (the pods of an earlier plan).
    async fn scale_to_zero(&mut self, path: &str) {
        let (parts, _, send) = self.next().await;
        assert_eq!((parts.method.as_str(), parts.uri.path()), ("GET", path));
        let sts =
            json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "x"}});
        send.send_response(response(200, &sts));
        let (parts, body, send) = self.next().await;
        assert_eq!((parts.method.as_str(), parts.uri.path()), ("PATCH", path));
        assert_eq!(content_type(&parts), "application/apply-patch+yaml");
        let q = query(&parts);
        assert!(
            q.contains(&"fieldManager=riverbank-operator-stop".to_string()),
            "{q:?}"
        );
        assert_eq!(body["spec"], json!({"replicas": 0}));
        send.send_response(response(200, &sts));
    }

    /// A JSON patch of the job's finalizers (guarded by a `test` operation); returns its
    /// operations.
    async fn finalizer_patch(&mut self) -> Value {
        let (parts, body, send) = self.next().await;
        assert_eq!(parts.method, Method::PATCH);
        assert_eq!(parts.uri.path(), JOB_PATH);
        assert_eq!(content_type(&parts), "application/json-patch+json");
        assert_eq!(body[0]["op"], "test", "{body}");
        send.send_response(response(200, &serde_json::to_value(job()).unwrap()));
        body
    }

    /// Fails the test if the reconcile made any request the scenario did not take.
    async fn nothing_more(mut self) {
        // The reconcile has returned, so any extra request is already queued.
        if let Ok(Some((request, _))) =
            timeout(Duration::from_millis(50), self.0.next_request()).await
        {
            panic!("unexpected request {} {}", request.method(), request.uri());
        }
    }
}

fn context(coordinator: Arc<FakeCoordinator>, pods: Vec<Value>) -> (Arc<Context>, ApiServer) {
    let (ctx, api) = bare_context(coordinator, pods);
    (Arc::new(ctx), api)
}

/// A context whose pod store (what the pod watch's reflector keeps) holds `pods`.
fn bare_context(coordinator: Arc<FakeCoordinator>, pods: Vec<Value>) -> (Context, ApiServer) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, NS);
    let reporter = Reporter {
        controller: FIELD_MANAGER.into(),
        instance: Some("test-operator-0".into()),
    };
    let ctx = Context::new(
        client,
        reporter,
        OperatorSettings::default(),
        coordinator,
        Arc::new(Metrics::default()),
        Duration::from_secs(10),
    );
    let (store, mut writer) = reflector::store::<Pod>();
    for pod in pods {
        writer.apply_watcher_event(&watcher::Event::Apply(serde_json::from_value(pod).unwrap()));
    }
    ctx.pods.register(None, store);
    (ctx, ApiServer(handle))
}

/// A pod of the test job: `component` (coordinator or worker), in `phase`.
fn job_pod(name: &str, component: &str, phase: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": NS,
            "labels": {"riverbank.dev/job": "test", "app.kubernetes.io/component": component}},
        "status": {"phase": phase}
    })
}

/// Reconciles `job` once while `scenario` plays the API server.
async fn reconcile_with<F, Fut>(
    job: DataflowJob,
    coordinator: Arc<FakeCoordinator>,
    scenario: F,
) -> (Result<Action, Error>, Arc<Context>)
where
    F: FnOnce(ApiServer) -> Fut,
    Fut: Future<Output = ApiServer> + Send + 'static,
{
    reconcile_with_pods(job, coordinator, vec![], scenario).await
}

/// Reconciles `job` once, with `pods` in the pod store, while `scenario` plays the API server.
async fn reconcile_with_pods<F, Fut>(
    job: DataflowJob,
    coordinator: Arc<FakeCoordinator>,
    pods: Vec<Value>,
    scenario: F,
) -> (Result<Action, Error>, Arc<Context>)
where
    F: FnOnce(ApiServer) -> Fut,
    Fut: Future<Output = ApiServer> + Send + 'static,
{
    let (ctx, api) = context(coordinator, pods);
    let server = tokio::spawn(scenario(api));
    // A scenario that fails leaves a request unanswered: the reconcile would wait forever.
    let result = timeout(
        Duration::from_secs(20),
        reconcile(Arc::new(job), ctx.clone()),
    )
    .await
    .expect("the reconcile ended (a failed scenario leaves it waiting: see its panic)");
    let api = timeout(Duration::from_secs(5), server)
        .await
        .expect("the scenario finished")
        .expect("the scenario's checks passed");
    api.nothing_more().await;
    (result, ctx)
}

fn condition(status: &Value, type_: &str) -> Value {
    status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .cloned()
        .unwrap_or_else(|| panic!("no {type_} condition in {status}"))
}

#[tokio::test]
async fn create_applies_children_writes_pending_and_plans_event() {
    let coordinator = FakeCoordinator::answering(None);
    let (result, ctx) = reconcile_with(job(), coordinator.clone(), |mut api| async move {
        assert_eq!(
            api.apply_children(0).await,
            (1, 2),
            "one coordinator, numWorkers workers"
        );
        let status = api.status().await;
        assert_eq!(status["state"], "Pending");
        assert_eq!(status["observedGeneration"], 1);
        assert_eq!(status["targetWorkers"], 2);
        assert_eq!(status["currentWorkers"], 0);
        assert_eq!(
            status["stages"][0]["componentTransforms"],
            json!(["Numbers", "Out"])
        );
        let ready = condition(&status, "Ready");
        assert_eq!(
            (ready["status"].as_str(), ready["reason"].as_str()),
            (Some("False"), Some("Starting"))
        );
        assert_eq!(ready["observedGeneration"], 1);
        assert!(ready["lastTransitionTime"].is_string());
        let (type_, reason, note) = api.event().await;
        assert_eq!((type_.as_str(), reason.as_str()), ("Normal", "Planned"));
        assert_eq!(
            note,
            "Planned 1 stages; starting the coordinator and 2 workers"
        );
        api
    })
    .await;
    assert_eq!(result.unwrap(), Action::requeue(STARTING_REQUEUE));
    assert!(
        coordinator.calls().is_empty(),
        "no coordinator to ask before the pods exist"
    );
    // The console shows what the status says, the plan's stages and the Event.
    let shown = ctx
        .console
        .job(NS, "test")
        .expect("the job is on the console");
    assert_eq!(
        (shown.summary.state.as_str(), shown.summary.target_workers),
        ("Pending", 2)
    );
    assert_eq!(shown.graph.stages[0].components, ["Numbers", "Out"]);
    assert_eq!(shown.events[0].reason, "Planned");
}

#[tokio::test]
async fn steady_state_reapplies_children_and_writes_nothing_else() {
    let coordinator = FakeCoordinator::answering(Some(progress(JobPhase::Running)));
    let (result, ctx) = reconcile_with(running_job(2), coordinator.clone(), |mut api| async move {
        assert_eq!(api.apply_children(2).await, (1, 2));
        // Status unchanged: no status write, no event.
        api
    })
    .await;
    assert_eq!(result.unwrap(), Action::requeue(FOLLOW_REQUEUE));
    assert_eq!(
        coordinator.calls(),
        [format!("GET {COORDINATOR_ADDRESS}/v1/status?wait_ms=5000")],
        "a running job's status follows the coordinator by long poll"
    );
    assert!(
        ctx.metrics
            .encode()
            .contains("riverbank_operator_reconciles_total{outcome=\"applied\"} 1")
    );
}

#[tokio::test]
async fn a_deleted_child_is_created_again_in_full() {
    // The worker StatefulSet was deleted: the watch on owned objects brings the reconciler back,
    // and the same apply creates it anew (no get-then-create race); its pods are gone, so
    // currentWorkers drops while the job stays Running.
    let coordinator = FakeCoordinator::answering(Some(progress(JobPhase::Running)));
    let (result, _) = reconcile_with(running_job(2), coordinator, |mut api| async move {
        api.apply(PLAN_PATH, None).await;
        api.apply(SERVICE_PATH, None).await;
        api.apply(COORDINATOR_PATH, None).await;
        let workers = api.apply(WORKERS_PATH, Some(json!({"replicas": 0}))).await;
        assert_eq!(workers["spec"]["replicas"], 2);
        assert_eq!(workers["spec"]["serviceName"], "test-headless");
        assert_eq!(
            workers["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"],
            "Delete"
        );
        let status = api.status().await;
        assert_eq!(status["state"], "Running");
        assert_eq!(status["currentWorkers"], 0);
        api
    })
    .await;
    result.unwrap();
}

#[tokio::test]
async fn invalid_pipeline_fails_once_and_waits_for_a_new_spec() {
    let mut bad = job();
    bad.spec.pipeline = serde_json::from_value(json!({"transforms": [
        {"type": "WriteToJson", "name": "Out", "input": "Missing", "config": {"path": "/x"}}
    ]}))
    .unwrap();
    let coordinator = FakeCoordinator::answering(None);
    let (result, ctx) = reconcile_with(bad.clone(), coordinator.clone(), |mut api| async move {
        let status = api.status().await;
        assert_eq!(status["state"], "Failed");
        let message = status["message"].as_str().unwrap();
        assert!(
            message.starts_with("Invalid pipeline:") && message.contains("Missing"),
            "{message}"
        );
        let ready = condition(&status, "Ready");
        assert_eq!(
            (ready["status"].as_str(), ready["reason"].as_str()),
            (Some("False"), Some("InvalidPipeline"))
        );
        assert_eq!(status["observedGeneration"], 1);
        let (type_, reason, note) = api.event().await;
        assert_eq!(
            (type_.as_str(), reason.as_str(), note.as_str()),
            ("Warning", "InvalidPipeline", message)
        );
        // Nothing runs, nothing to cancel: no finalizer (a fixed spec brings it back).
        expect_release(&mut api).await;
        api
    })
    .await;
    assert_eq!(
        result.unwrap(),
        Action::await_change(),
        "no requeue for a permanent error"
    );
    assert!(ctx.metrics.encode().contains("outcome=\"invalid\"} 1"));

    // Its own status update brings it back: nothing to do, no request at all.
    let status = status::invalid_status(&bad, lifecycle::INVALID_PIPELINE, "x", Timestamp::now());
    bad.status = Some(status.clone());
    bad.metadata.finalizers = None;
    let (result, _) =
        reconcile_with(bad.clone(), coordinator.clone(), |api| async move { api }).await;
    assert_eq!(result.unwrap(), Action::await_change());

    // The user fixes the pipeline (generation 2): planned and started afresh, with the
    // finalizer back.
    let mut fixed = job();
    fixed.metadata.generation = Some(2);
    fixed.metadata.finalizers = None;
    fixed.status = Some(status);
    let (result, _) = reconcile_with(fixed, coordinator.clone(), |mut api| async move {
        api.finalizer_patch().await;
        assert_eq!(api.apply_children(0).await, (1, 2));
        let status = api.status().await;
        assert_eq!(
            (
                status["state"].as_str(),
                status["observedGeneration"].as_i64()
            ),
            (Some("Pending"), Some(2))
        );
        assert!(status.get("completionTime").is_none());
        assert_eq!(api.event().await.1, "Planned");
        api
    })
    .await;
    result.unwrap();
    assert!(coordinator.calls().is_empty());
}

#[tokio::test]
async fn an_invalid_new_spec_stops_the_pods_of_the_old_one() {
    let mut job = running_job(2);
    job.metadata.generation = Some(2);
    job.spec.pods = Some(
        serde_json::from_value(json!({"env": [{"name": "RIVERBANK_JOB", "value": "x"}]})).unwrap(),
    );
    let (result, _) = reconcile_with(
        job,
        FakeCoordinator::answering(None),
        |mut api| async move {
            api.scale_to_zero(COORDINATOR_PATH).await;
            api.scale_to_zero(WORKERS_PATH).await;
            let status = api.status().await;
            assert_eq!(status["state"], "Failed");
            assert_eq!(condition(&status, "Ready")["reason"], "InvalidSpec");
            assert!(
                status.get("stages").is_none(),
                "the old plan's stages no longer apply"
            );
            assert_eq!(api.event().await.1, "InvalidSpec");
            expect_release(&mut api).await;
            api
        },
    )
    .await;
    assert_eq!(result.unwrap(), Action::await_change());
}

#[tokio::test]
async fn cancel_tells_the_coordinator_and_scales_to_zero_at_once() {
    let mut job = running_job(2);
    job.spec.desired_state = DesiredState::Cancelled;
    let coordinator = FakeCoordinator::answering(Some(progress(JobPhase::Running)));
    let (result, _) = reconcile_with(job, coordinator.clone(), |mut api| async move {
        assert_eq!(
            api.apply_children(2).await,
            (0, 0),
            "coordinator and workers to zero"
        );
        let status = api.status().await;
        assert_eq!(status["state"], "Cancelled");
        assert_eq!(status["targetWorkers"], 0);
        assert!(status["completionTime"].is_string());
        assert_eq!(condition(&status, "Progressing")["status"], "False");
        let (type_, reason, note) = api.event().await;
        assert_eq!((type_.as_str(), reason.as_str()), ("Normal", "Cancelled"));
        assert!(note.contains("aborted its sinks"), "{note}");
        // Cancelled and at zero in one reconcile: the finalizer goes with it.
        expect_release(&mut api).await;
        api
    })
    .await;
    assert_eq!(result.unwrap(), Action::await_change());
    assert_eq!(
        coordinator.calls(),
        [format!("POST {COORDINATOR_ADDRESS}/v1/cancel")]
    );
}

#[tokio::test]
async fn completion_is_recorded_then_workers_scale_to_zero() {
    let mut done = progress(JobPhase::Done);
    done.message = "all stages done".into();
    done.fraction_consumed = 1.0;
    done.finished_at = Some("2025-03-01T10:05:00Z".into());
    let coordinator = FakeCoordinator::answering(Some(done));
    let (result, _) = reconcile_with(running_job(2), coordinator.clone(), |mut api| async move {
        // Done is recorded before anything is scaled down: a failed status write loses nothing.
        assert_eq!(api.apply_children(2).await, (1, 2));
        let status = api.status().await;
        assert_eq!(status["state"], "Done");
        assert_eq!(status["completionTime"], "2025-03-01T10:05:00Z");
        assert_eq!(status["progress"], 1.0);
        assert_eq!(
            status["targetWorkers"], 2,
            "what the StatefulSet still runs until Done is stored"
        );
        let (_, reason, note) = api.event().await;
        assert_eq!(reason, "Completed");
        assert_eq!(
            note,
            "all stages done; scaling the coordinator and workers to zero"
        );
        api
    })
    .await;
    assert_eq!(
        result.unwrap(),
        Action::requeue(Duration::ZERO),
        "its own status write does not bring the job back: it asks to be looked at again"
    );

    // The next reconcile sees Done: no coordinator, no pods, both StatefulSets to zero, and
    // targetWorkers and currentWorkers follow.
    let mut finished = running_job(2);
    let mut s = finished.status.clone().unwrap();
    s.state = Some(JobState::Done);
    finished.status = Some(s);
    let coordinator = FakeCoordinator::answering(None);
    let (result, _) = reconcile_with(finished, coordinator.clone(), |mut api| async move {
        assert_eq!(api.apply_children(0).await, (0, 0));
        let status = api.status().await;
        assert_eq!(
            (
                status["state"].as_str(),
                status["targetWorkers"].as_i64(),
                status["currentWorkers"].as_i64()
            ),
            (Some("Done"), Some(0), Some(0))
        );
        // Over, its final state stored, its pods at zero: nothing left to cancel, so the
        // finalizer goes (a namespace deleted without the operator is not held by it).
        expect_release(&mut api).await;
        api
    })
    .await;
    assert_eq!(result.unwrap(), Action::await_change());
    assert!(coordinator.calls().is_empty());
}

/// A Beam SDK pipeline's job runs its runner pod and its SDK worker pods (behind its
/// NetworkPolicy), is followed through the runner's `JobProgress` like any job, and is
/// autoscaled like any batch job on the backlog the runner reports: the SDK worker pods are
/// scaled, and the runner is told their pools.
#[tokio::test]
async fn a_beam_sdk_job_runs_its_runner_pod_and_sdk_workers_and_reports_its_progress() {
    let mut job = running_job(2);
    let sdk = JobBuilder::new("test").beam_sdk().build();
    job.spec.pipeline = None;
    job.spec.beam_pipeline = sdk.spec.beam_pipeline;
    // Two SDK worker pods busy, 10,000 worker-seconds of the running stage left (as in
    // `a_backlog_scales_the_workers_up_then_max_num_workers_is_reported`).
    let mut running = busy(2, 0.9, 1_000_000, 200.0);
    running.stages = ["Impulse", "Sum/Precombine", "Sum/Group"]
        .iter()
        .enumerate()
        .map(
            |(index, name)| riverbank_pipeline::progress::StageProgress {
                index,
                name: name.to_string(),
                ..Default::default()
            },
        )
        .collect();
    running.message = "stage 3 (ref_AppliedPTransform_Sum) done in 1.2 s: 10 in, 3 out".into();
    let coordinator = FakeCoordinator::answering(Some(running));
    let (result, _) = reconcile_with(job, coordinator.clone(), |mut api| async move {
        api.apply(PLAN_PATH, None).await;
        api.apply(SERVICE_PATH, None).await;
        let policy = api.apply(NETWORK_POLICY_PATH, None).await;
        assert_eq!(
            policy["spec"]["podSelector"]["matchLabels"]["riverbank.dev/job"],
            "test"
        );
        let runner = api.apply(COORDINATOR_PATH, None).await;
        let pod = &runner["spec"]["template"]["spec"];
        assert_eq!(pod["containers"][0]["args"][0], "runner-harness");
        assert_eq!(pod["containers"].as_array().unwrap().len(), 1);
        assert_eq!(runner["spec"]["replicas"], 1);
        let workers = api
            .apply(
                WORKERS_PATH,
                Some(json!({"replicas": 2, "readyReplicas": 2})),
            )
            .await;
        assert_eq!(
            workers["spec"]["template"]["spec"]["containers"][0]["name"],
            "sdk"
        );
        assert_eq!(
            workers["spec"]["replicas"], 4,
            "the engine's target, maxNumWorkers"
        );
        let status = api.status().await;
        assert_eq!(status["state"], "Running");
        assert_eq!(status["targetWorkers"], 4);
        assert_eq!(status["stages"][1]["name"], "Sum/Precombine", "{status}");
        assert!(
            status["message"]
                .as_str()
                .unwrap()
                .contains("ref_AppliedPTransform_Sum"),
            "{status}"
        );
        let (_, reason, note) = api.event().await;
        assert_eq!(reason, "Scaling", "{note}");
        assert!(note.starts_with("Scaling 2 -> 4 workers"), "{note}");
        api
    })
    .await;
    result.unwrap();
    let pools: Vec<String> = (0..4)
        .map(|i| format!("test-worker-{i}.test-headless.default.svc.cluster.local:50000"))
        .collect();
    assert_eq!(
        coordinator.calls(),
        [
            format!("GET {COORDINATOR_ADDRESS}/v1/status?wait_ms=5000"),
            format!(
                "POST {COORDINATOR_ADDRESS}/v1/sdk-workers {}",
                pools.join(",")
            ),
        ],
        "the runner pod answers where a coordinator would, and hears of the pods scaled"
    );
}

/// A job that ended in `state` and whose pods are at zero, as the reconcile that stopped them
/// left its status (so the next one writes none).
fn final_job(state: JobState) -> DataflowJob {
    let mut job = running_job(0);
    job.status.as_mut().unwrap().state = Some(state);
    let plan = job.plan().unwrap();
    let mut s = status::planned_status(
        &job,
        status::Observed {
            stages: StageStatus::from_plan(&plan),
            target_workers: 0,
            progress: None,
            pod_problem: None,
            cancel: None,
            insights: crate::insights::Found::default(),
            autoscaling: None,
            memory: None,
            streaming: Default::default(),
            now: Timestamp::from_second(1_740_823_300).unwrap(),
        },
    );
    s.current_workers = Some(0);
    job.status = Some(s);
    job
}

#[tokio::test]
async fn a_final_job_holds_no_finalizer_and_is_not_given_one() {
    // Every final state, once its pods are at zero.
    for state in [
        JobState::Done,
        JobState::Failed,
        JobState::Cancelled,
        JobState::Drained,
    ] {
        let finished = final_job(state);
        let (result, ctx) = reconcile_with(
            finished,
            FakeCoordinator::answering(None),
            |mut api| async move {
                assert_eq!(api.apply_children(0).await, (0, 0));
                expect_release(&mut api).await;
                api
            },
        )
        .await;
        assert_eq!(result.unwrap(), Action::await_change(), "{state:?}");
        // Not deleted: it stays on the console.
        assert!(ctx.console.job(NS, "test").is_some());
    }

    // Released already: the final job's next reconciles (say, after an operator restart) do
    // not add it back.
    let mut released = final_job(JobState::Done);
    released.metadata.finalizers = None;
    let (result, _) = reconcile_with(
        released.clone(),
        FakeCoordinator::answering(None),
        |mut api| async move {
            api.apply_children(0).await;
            api
        },
    )
    .await;
    assert_eq!(result.unwrap(), Action::await_change());

    // And deleting it (or its namespace) needs nobody: the operator has nothing to do.
    let (result, _) = reconcile_with(
        deleted(released, Duration::from_secs(1)),
        FakeCoordinator::answering(None),
        |api| async move { api },
    )
    .await;
    assert_eq!(result.unwrap(), Action::await_change());
}

#[tokio::test]
async fn an_active_job_that_lost_its_finalizer_gets_it_back() {
    // Released by hand (say, while the operator was uninstalled), then the operator is back.
    let mut running = running_job(2);
    running.metadata.finalizers = None;
    let coordinator = FakeCoordinator::answering(Some(progress(JobPhase::Running)));
    let (result, _) = reconcile_with(running, coordinator, |mut api| async move {
        let ops = api.finalizer_patch().await;
        assert_eq!(ops[1]["value"], json!(["riverbank.dev/cleanup"]));
        api.apply_children(2).await;
        api
    })
    .await;
    assert_eq!(result.unwrap(), Action::requeue(FOLLOW_REQUEUE));
}

#[tokio::test]
async fn a_failed_job_reports_transform_and_record() {
    let mut failed = progress(JobPhase::Failed);
    failed.failure = Some(JobFailure {
        transform: Some("Out".into()),
        message: "permission denied writing /data/out.jsonl".into(),
        record: None,
        attempts: 4,
    });
    let (result, _) = reconcile_with(
        running_job(2),
        FakeCoordinator::answering(Some(failed)),
        |mut api| async move {
            api.apply_children(2).await;
            let status = api.status().await;
            assert_eq!(status["state"], "Failed");
            let expected = "Out: permission denied writing /data/out.jsonl (4 attempts)";
            assert_eq!(status["message"], expected);
            assert_eq!(condition(&status, "Ready")["reason"], "Failed");
            let (type_, reason, note) = api.event().await;
            assert_eq!(
                (type_.as_str(), reason.as_str(), note.as_str()),
                ("Warning", "Failed", expected)
            );
            api
        },
    )
    .await;
    assert_eq!(result.unwrap(), Action::requeue(Duration::ZERO));
}

#[tokio::test]
async fn stuck_pods_show_in_status_conditions_and_events() {
    let stuck = json!({
        "metadata": {"name": "test-worker-1", "namespace": NS, "labels": {"riverbank.dev/job": "test"}},
        "status": {"phase": "Pending", "containerStatuses": [{"name": "worker", "image": "riverbank/worker:nope",
            "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"riverbank/worker:nope\""}}}]}
    });
    let (result, _) = reconcile_with_pods(running_job(1), FakeCoordinator::answering(Some(progress(JobPhase::Running))), vec![stuck], |mut api| async move {
        api.apply_children(1).await;
        let status = api.status().await;
        assert_eq!(status["state"], "Running");
        let expected = "pod test-worker-1: ImagePullBackOff: Back-off pulling image \"riverbank/worker:nope\"";
        assert_eq!(status["message"], expected);
        let degraded = condition(&status, "Degraded");
        assert_eq!((degraded["status"].as_str(), degraded["reason"].as_str()), (Some("True"), Some("ImagePullBackOff")));
        assert_eq!(condition(&status, "Ready")["status"], "False");
        let (type_, reason, note) = api.event().await;
        assert_eq!((type_.as_str(), reason.as_str(), note.as_str()), ("Warning", "ImagePullBackOff", expected));
        api
    })
    .await;
    result.unwrap();
}

#[tokio::test]
async fn api_errors_back_off_and_are_counted() {
    let (result, ctx) = reconcile_with(
        job(),
        FakeCoordinator::answering(None),
        |mut api| async move {
            let (parts, _, send) = api.next().await;
            assert_eq!(parts.uri.path(), PLAN_PATH);
            let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": "etcdserver: request timed out", "reason": "InternalError", "code": 500});
            send.send_response(response(500, &status));
            api
        },
    )
    .await;
    let error = result.unwrap_err();
    assert_eq!(error.kind(), "api");
    let job = Arc::new(job());
    assert_eq!(
        error_policy(job.clone(), &error, ctx.clone()),
        Action::requeue(Duration::from_secs(5))
    );
    assert_eq!(
        error_policy(job.clone(), &error, ctx.clone()),
        Action::requeue(Duration::from_secs(10))
    );
    assert_eq!(backoff(20), Duration::from_secs(300));
    let metrics = ctx.metrics.encode();
    assert!(
        metrics.contains("riverbank_operator_reconcile_errors_total{error=\"api\"} 2"),
        "{metrics}"
    );
    assert!(metrics.contains("riverbank_operator_reconciles_total{outcome=\"error\"} 1"));
}

#[tokio::test]
async fn metrics_only_changes_are_written_once_per_poll_interval() {
    // The coordinator's numbers moved, nothing else did.
    let mut moved = progress(JobPhase::Running);
    moved.throughput_elements_per_sec = 55.0;
    moved.backlog_seconds = Some(12.0);
    moved.message = "2 of 4 work items done".into();
    let coordinator = FakeCoordinator::answering(Some(moved));
    let (ctx, mut api) = context(coordinator, vec![]);
    let job = Arc::new(running_job(2));

    // First time: written.
    let server = tokio::spawn(async move {
        api.apply_children(2).await;
        let status = api.status().await;
        assert_eq!(
            (
                status["throughput"].as_f64(),
                status["backlogSeconds"].as_i64()
            ),
            (Some(55.0), Some(12))
        );
        assert_eq!(status["message"], "2 of 4 work items done");
        api
    });
    reconcile(job.clone(), ctx.clone()).await.unwrap();
    let mut api = timeout(Duration::from_secs(5), server)
        .await
        .unwrap()
        .unwrap();

    // The reconcile that this write triggers (same old object here, new numbers again) within
    // the poll interval: observed and applied, but not written.
    let server = tokio::spawn(async move {
        api.apply_children(2).await;
        api
    });
    reconcile(job, ctx.clone()).await.unwrap();
    let api = timeout(Duration::from_secs(5), server)
        .await
        .unwrap()
        .unwrap();
    api.nothing_more().await;
}

/// The autoscaler's clock, moved by hand.
struct FakeClock(Mutex<f64>);

impl Clock for FakeClock {
    fn now_secs(&self) -> f64 {
        *self.0.lock().unwrap()
    }
}

/// A running batch job's progress: `workers` live workers at `cpu`, `remaining` bytes of work
/// left, processed at `throughput` bytes/s, 8 work items ready to run.
fn busy(workers: usize, cpu: f64, remaining: u64, throughput: f64) -> JobProgress {
    let mut p = progress(JobPhase::Running);
    p.remaining_bytes = remaining;
    p.throughput_bytes_per_sec = throughput;
    p.backlog_seconds = Some(remaining as f64 / throughput);
    p.runnable_items = 8;
    p.workers = (0..workers)
        .map(|i| riverbank_pipeline::progress::WorkerProgress {
            name: format!("test-worker-{i}"),
            alive: true,
            cpu,
            ..Default::default()
        })
        .collect();
    p
}

#[tokio::test]
async fn a_backlog_scales_the_workers_up_then_max_num_workers_is_reported() {
    // Batch, numWorkers 2, maxNumWorkers 4: 1 MB left at 100 B/s per worker is 10,000
    // worker-seconds of work, which the engine sizes at (more than) the maximum.
    let coordinator = FakeCoordinator::answering(Some(busy(2, 0.9, 1_000_000, 200.0)));
    let clock = Arc::new(FakeClock(Mutex::new(1_000.0)));
    let (ctx, mut api) = bare_context(coordinator.clone(), vec![]);
    let ctx = Arc::new(ctx.with_clock(clock.clone()));
    let server = tokio::spawn(async move {
        assert_eq!(
            api.apply_children(2).await,
            (1, 4),
            "the worker StatefulSet carries the engine's target"
        );
        let status = api.status().await;
        assert_eq!(status["targetWorkers"], 4);
        assert_eq!(status["currentWorkers"], 2);
        assert_eq!(status["backlogSeconds"], 5000);
        assert_eq!(condition(&status, "Degraded")["status"], "False");
        let (type_, reason, note) = api.event().await;
        assert_eq!((type_.as_str(), reason.as_str()), ("Normal", "Scaling"));
        assert_eq!(
            note,
            "Scaling 2 -> 4 workers (SCALE_TO_REMAINING_WORK): 10000 worker-s of work left at 100 B/s per worker → 4 workers: 2 → 4"
        );
        (api, status)
    });
    let action = reconcile(Arc::new(running_job(2)), ctx.clone())
        .await
        .unwrap();
    assert_eq!(action, Action::requeue(FOLLOW_REQUEUE));
    let (mut api, written) = timeout(Duration::from_secs(5), server)
        .await
        .unwrap()
        .unwrap();

    // 30 s later (a batch job's evaluation interval) the four workers run at 95 % CPU with work
    // left: no more are allowed, which is the MAX_NUM_WORKERS insight.
    *coordinator.progress.lock().unwrap() = Some(busy(4, 0.95, 800_000, 400.0));
    *clock.0.lock().unwrap() += 30.0;
    let mut job = running_job(2);
    job.status = Some(serde_json::from_value(written).unwrap());
    let server = tokio::spawn(async move {
        assert_eq!(api.apply_children(4).await, (1, 4));
        let status = api.status().await;
        assert_eq!(
            (
                status["targetWorkers"].as_i64(),
                status["currentWorkers"].as_i64()
            ),
            (Some(4), Some(4))
        );
        let degraded = condition(&status, "Degraded");
        assert_eq!(
            (degraded["status"].as_str(), degraded["reason"].as_str()),
            (Some("True"), Some("MAX_NUM_WORKERS"))
        );
        let insight = &status["insights"][0];
        assert_eq!(insight["type"], "MAX_NUM_WORKERS");
        assert_eq!(insight["message"], degraded["message"]);
        assert!(
            insight["recommendation"]
                .as_str()
                .unwrap()
                .starts_with("Increase or remove options.maxNumWorkers"),
            "{insight}"
        );
        let (type_, reason, note) = api.event().await;
        assert_eq!(
            (type_.as_str(), reason.as_str()),
            ("Warning", "MAX_NUM_WORKERS")
        );
        assert_eq!(
            note,
            format!(
                "{} Recommendation: {}",
                insight["message"].as_str().unwrap(),
                insight["recommendation"].as_str().unwrap()
            )
        );
        assert!(
            note.contains("maxNumWorkers (4)") && note.contains("keeping 4"),
            "{note}"
        );
        api
    });
    reconcile(Arc::new(job), ctx.clone()).await.unwrap();
    let api = timeout(Duration::from_secs(5), server)
        .await
        .unwrap()
        .unwrap();
    api.nothing_more().await;
    assert_eq!(coordinator.calls().len(), 2);
}

#[tokio::test]
async fn a_new_job_gets_the_finalizer_first() {
    let mut new = job();
    new.metadata.finalizers = None;
    let (result, _) = reconcile_with(new, FakeCoordinator::answering(None), |mut api| async move {
        let ops = api.finalizer_patch().await;
        assert_eq!(
            ops,
            json!([
                {"op": "test", "path": "/metadata/finalizers", "value": null},
                {"op": "add", "path": "/metadata/finalizers", "value": ["riverbank.dev/cleanup"]}
            ])
        );
        // Then the same reconcile goes on: children, status, event.
        api.apply_children(0).await;
        assert_eq!(api.status().await["state"], "Pending");
        assert_eq!(api.event().await.1, "Planned");
        api
    })
    .await;
    result.unwrap();

    // Other finalizers are kept: ours is appended to the list tested as it was.
    let mut theirs = job();
    theirs.metadata.finalizers = Some(vec!["example.com/audit".into()]);
    let (result, _) = reconcile_with(theirs, FakeCoordinator::answering(None), |mut api| async move {
        let ops = api.finalizer_patch().await;
        assert_eq!(ops[0]["value"], json!(["example.com/audit"]));
        assert_eq!(
            ops[1],
            json!({"op": "add", "path": "/metadata/finalizers/-", "value": "riverbank.dev/cleanup"})
        );
        api.apply_children(0).await;
        api.status().await;
        api.event().await;
        api
    })
    .await;
    result.unwrap();
}

/// `job` deleted `ago` ago (deletionTimestamp set, our finalizer still on).
fn deleted(mut job: DataflowJob, ago: Duration) -> DataflowJob {
    let at = Timestamp::now() - SignedDuration::try_from(ago).unwrap();
    job.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at));
    job
}

/// The finalizer removed: a JSON patch testing that index 0 is ours, then removing it.
async fn expect_release(api: &mut ApiServer) {
    let ops = api.finalizer_patch().await;
    assert_eq!(
        ops,
        json!([
            {"op": "test", "path": "/metadata/finalizers/0", "value": "riverbank.dev/cleanup"},
            {"op": "remove", "path": "/metadata/finalizers/0"}
        ])
    );
}

#[tokio::test]
async fn deleting_a_running_job_cancels_it_through_the_coordinator_then_releases_it() {
    let coordinator = FakeCoordinator::answering(Some(progress(JobPhase::Running)));
    let pods = vec![
        job_pod("test-coordinator-0", "coordinator", "Running"),
        job_pod("test-worker-0", "worker", "Running"),
    ];
    let job = deleted(running_job(2), Duration::from_secs(1));
    let (result, ctx) = reconcile_with_pods(job, coordinator.clone(), pods, |mut api| async move {
        let (type_, reason, note) = api.event().await;
        assert_eq!((type_.as_str(), reason.as_str()), ("Normal", "CleanedUp"));
        assert!(note.contains("aborted its sinks"), "{note}");
        expect_release(&mut api).await;
        // Nothing else: no children applied, no status written; the children go by garbage
        // collection (their owner references).
        api
    })
    .await;
    assert_eq!(result.unwrap(), Action::await_change());
    assert_eq!(
        coordinator.calls(),
        [
            format!("POST {COORDINATOR_ADDRESS}/v1/cancel"),
            format!("GET {COORDINATOR_ADDRESS}/v1/status?wait_ms=2000"),
        ],
        "cancel, then a bounded wait for the final phase"
    );
    assert!(
        ctx.metrics
            .encode()
            .contains("riverbank_operator_reconciles_total{outcome=\"cleanup\"} 1")
    );
}

#[tokio::test]
async fn a_deleted_job_that_is_over_or_never_ran_is_released_at_once() {
    let mut done = running_job(0);
    done.status.as_mut().unwrap().state = Some(JobState::Done);
    let mut starting = job();
    starting.status = Some(DataflowJobStatus {
        state: Some(JobState::Pending),
        ..Default::default()
    });
    for job in [done, starting, job()] {
        let coordinator = FakeCoordinator::answering(Some(progress(JobPhase::Running)));
        let job = deleted(job, Duration::from_secs(1));
        let (result, _) = reconcile_with(job, coordinator.clone(), |mut api| async move {
            expect_release(&mut api).await;
            api
        })
        .await;
        assert_eq!(result.unwrap(), Action::await_change());
        assert!(coordinator.calls().is_empty(), "no coordinator to stop");
    }

    // Our finalizer already gone (another one holds the job): nothing to do.
    let mut released = deleted(job(), Duration::from_secs(1));
    released.metadata.finalizers = Some(vec!["example.com/audit".into()]);
    let (result, _) = reconcile_with(
        released,
        FakeCoordinator::answering(None),
        |api| async move { api },
    )
    .await;
    assert_eq!(result.unwrap(), Action::await_change());
}

#[tokio::test]
async fn a_coordinator_that_does_not_confirm_delays_deletion_only_until_the_timeout() {
    let pods = || vec![job_pod("test-coordinator-0", "coordinator", "Running")];
    // Within the bound: asked again shortly, nothing written.
    for coordinator in [
        FakeCoordinator::answering(None),
        FakeCoordinator::stuck(progress(JobPhase::Running)),
    ] {
        let job = deleted(running_job(2), Duration::from_secs(5));
        let (result, _) =
            reconcile_with_pods(job, coordinator.clone(), pods(), |api| async move { api }).await;
        assert_eq!(result.unwrap(), Action::requeue(CLEANUP_RETRY));
        assert_eq!(
            coordinator.calls()[0],
            format!("POST {COORDINATOR_ADDRESS}/v1/cancel")
        );
    }
    // Past it (30 s by default): released with a Warning saying what may remain.
    for coordinator in [
        FakeCoordinator::answering(None),
        FakeCoordinator::stuck(progress(JobPhase::Running)),
    ] {
        let job = deleted(running_job(2), Duration::from_secs(31));
        let (result, _) = reconcile_with_pods(job, coordinator, pods(), |mut api| async move {
            let (type_, reason, note) = api.event().await;
            assert_eq!(
                (type_.as_str(), reason.as_str()),
                ("Warning", "CleanupTimedOut")
            );
            assert!(note.contains(".temp-riverbank-"), "{note}");
            expect_release(&mut api).await;
            api
        })
        .await;
        assert_eq!(result.unwrap(), Action::await_change());
    }
}

#[tokio::test]
async fn a_starting_job_with_its_coordinator_up_is_followed_by_long_poll() {
    let mut pending = job();
    pending.status = Some(DataflowJobStatus {
        state: Some(JobState::Pending),
        observed_generation: Some(1),
        ..Default::default()
    });
    // The coordinator pod is not running yet: a plain request.
    let coordinator = FakeCoordinator::answering(None);
    let (result, _) = reconcile_with_pods(
        pending.clone(),
        coordinator.clone(),
        vec![job_pod("test-coordinator-0", "coordinator", "Pending")],
        |mut api| async move {
            api.apply_children(0).await;
            api.status().await;
            api
        },
    )
    .await;
    assert_eq!(result.unwrap(), Action::requeue(STARTING_REQUEUE));
    assert_eq!(
        coordinator.calls(),
        [format!("GET {COORDINATOR_ADDRESS}/v1/status")]
    );
    // It runs: the request waits for the job to change, and Running is written at once.
    let coordinator = FakeCoordinator::answering(Some(progress(JobPhase::Running)));
    let (result, _) = reconcile_with_pods(
        pending,
        coordinator.clone(),
        vec![job_pod("test-coordinator-0", "coordinator", "Running")],
        |mut api| async move {
            api.apply_children(2).await;
            assert_eq!(api.status().await["state"], "Running");
            assert_eq!(api.event().await.1, "Running");
            api
        },
    )
    .await;
    assert_eq!(result.unwrap(), Action::requeue(FOLLOW_REQUEUE));
    assert_eq!(
        coordinator.calls(),
        [format!("GET {COORDINATOR_ADDRESS}/v1/status?wait_ms=5000")]
    );
}

#[test]
fn status_writes_do_not_bring_a_job_back_but_spec_deletion_and_finalizers_do() {
    let base = running_job(2);
    let trigger = |j: &DataflowJob| job_trigger(j).unwrap();
    let mut status_only = base.clone();
    status_only.status.as_mut().unwrap().throughput = Some(99.0);
    status_only.metadata.resource_version = Some("42".into());
    assert_eq!(trigger(&status_only), trigger(&base));

    let mut new_spec = base.clone();
    new_spec.metadata.generation = Some(2);
    let mut deleting = base.clone();
    deleting.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::from_second(1).unwrap()),
    );
    let mut no_finalizer = base.clone();
    no_finalizer.metadata.finalizers = None;
    let mut annotated = base.clone();
    annotated.metadata.annotations =
        Some([("example.com/owner".to_string(), "me".to_string())].into());
    for changed in [new_spec, deleting, no_finalizer, annotated] {
        assert_ne!(trigger(&changed), trigger(&base), "{:?}", changed.metadata);
    }
}

#[test]
fn next_look_follows_the_state() {
    let two = Replicas {
        coordinator: 1,
        workers: 2,
    };
    let interval = Duration::from_secs(10);
    assert_eq!(
        next_action(Some(JobState::Running), two, interval),
        Action::requeue(FOLLOW_REQUEUE)
    );
    assert_eq!(
        next_action(Some(JobState::Pending), two, interval),
        Action::requeue(STARTING_REQUEUE)
    );
    assert_eq!(
        next_action(Some(JobState::Done), two, interval),
        Action::requeue(Duration::ZERO),
        "just finished: scale to zero next"
    );
    assert_eq!(
        next_action(Some(JobState::Done), Replicas::STOPPED, interval),
        Action::await_change()
    );
}

#[tokio::test]
async fn the_controller_stops_promptly_on_the_stop_signal() {
    // A controller whose API server never answers its watches (the worst case for a stop):
    // it must still end as soon as it is told to.
    let (ctx, api) = context(FakeCoordinator::answering(None), vec![]);
    let (stop_tx, stop) = watch::channel(false);
    let running = tokio::spawn(async move {
        run(ctx, &[], stop).await;
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let asked = Instant::now();
    stop_tx.send_replace(true);
    timeout(Duration::from_secs(2), running)
        .await
        .expect("the controller stopped within 2 s")
        .unwrap();
    assert!(asked.elapsed() < Duration::from_secs(2));
    drop(api);
}

/// `running_job(ready)` with other options (numbers pipeline and 10 GB disks kept), running
/// `ready` workers as its target.
fn running_with(options: JobOptions, ready: i32) -> DataflowJob {
    let mut j = running_job(ready);
    j.status.as_mut().unwrap().target_workers = Some(ready);
    j.spec.options = JobOptions {
        disk_size_gb: Some(10),
        ..options
    };
    j
}

/// Reconciles `job` once on `ctx` while `scenario` plays the API server.
async fn reconcile_on<F, Fut>(
    ctx: &Arc<Context>,
    api: ApiServer,
    job: DataflowJob,
    scenario: F,
) -> ApiServer
where
    F: FnOnce(ApiServer) -> Fut,
    Fut: Future<Output = ApiServer> + Send + 'static,
{
    let server = tokio::spawn(scenario(api));
    reconcile(Arc::new(job), ctx.clone()).await.unwrap();
    timeout(Duration::from_secs(5), server)
        .await
        .expect("the scenario finished")
        .expect("the scenario's checks passed")
}

#[tokio::test]
async fn a_one_worker_job_that_is_not_scaled_says_why_in_status_without_a_write_per_evaluation() {
    // Batch, one worker, maxNumWorkers 4: 50 s of work left (5000 B at 100 B/s).
    let options = JobOptions {
        num_workers: Some(1),
        max_num_workers: Some(4),
        ..Default::default()
    };
    let coordinator = FakeCoordinator::answering(Some(busy(1, 0.9, 5_000, 100.0)));
    let clock = Arc::new(FakeClock(Mutex::new(1_000.0)));
    let (ctx, api) = bare_context(coordinator.clone(), vec![]);
    let ctx = Arc::new(ctx.with_clock(clock.clone()));
    let written = Arc::new(Mutex::new(Value::Null));
    let w = written.clone();
    let api = reconcile_on(&ctx, api, running_with(options.clone(), 1), |mut api| async move {
        assert_eq!(api.apply_children(1).await.1, 1, "the one worker is kept");
        let status = api.status().await;
        let evaluation = &status["autoscaling"]["lastEvaluation"];
        assert_eq!(evaluation["decision"], "Hold");
        assert_eq!(evaluation["reason"], "HOLD_PAUSE_COST");
        assert_eq!(
            (evaluation["currentWorkers"].as_i64(), evaluation["targetWorkers"].as_i64()),
            (Some(1), Some(1))
        );
        assert_eq!(
            evaluation["message"],
            "1 worker kept: 50 s of work left is less than a 60 s start-up (50 worker-s of work left at 100 B/s per worker → 2 workers)"
        );
        assert!(evaluation["time"].is_string());
        assert!(evaluation.get("dryRun").is_none());
        *w.lock().unwrap() = status;
        // A hold is no Event.
        api
    })
    .await;
    let with_status = |options: &JobOptions| {
        let mut j = running_with(options.clone(), 1);
        j.status = Some(serde_json::from_value(written.lock().unwrap().clone()).unwrap());
        j
    };

    // 30 s later, the next evaluation: the same hold on 40 s of work. Only its numbers moved:
    // not written again within the status interval.
    *coordinator.progress.lock().unwrap() = Some(busy(1, 0.9, 4_000, 100.0));
    *clock.0.lock().unwrap() += 30.0;
    let api = reconcile_on(&ctx, api, with_status(&options), |mut api| async move {
        api.apply_children(1).await;
        api
    })
    .await;

    // 30 s later the work has grown: a different decision is written at once.
    *coordinator.progress.lock().unwrap() = Some(busy(1, 0.9, 1_000_000, 100.0));
    *clock.0.lock().unwrap() += 30.0;
    let api = reconcile_on(&ctx, api, with_status(&options), |mut api| async move {
        assert_eq!(api.apply_children(1).await.1, 4);
        let status = api.status().await;
        let evaluation = &status["autoscaling"]["lastEvaluation"];
        assert_eq!(
            (
                evaluation["decision"].as_str(),
                evaluation["reason"].as_str()
            ),
            (Some("ScaleUp"), Some("SCALE_TO_REMAINING_WORK"))
        );
        assert_eq!(evaluation["targetWorkers"], 4);
        assert_eq!(api.event().await.1, "Scaling");
        api
    })
    .await;
    api.nothing_more().await;
}

/// A worker pod of the test job whose container has `memory` and was last OOMKilled if `oom`.
fn memory_pod(name: &str, memory: &str, oom: bool) -> Value {
    json!({
        "metadata": {"name": name, "namespace": NS,
            "labels": {"riverbank.dev/job": "test", "app.kubernetes.io/component": "worker"}},
        "spec": {"containers": [{"name": "worker",
            "resources": {"requests": {"memory": memory}, "limits": {"memory": memory}}}]},
        "status": {"phase": "Running", "containerStatuses": [{"name": "worker", "image": "i",
            "imageID": "", "ready": true, "restartCount": 1, "state": {"running": {}},
            "lastState": if oom { json!({"terminated": {"exitCode": 137, "reason": "OOMKilled"}}) } else { json!({}) }}]}
    })
}

/// The four children applied; returns the worker container's resources.
async fn apply_children_resources(api: &mut ApiServer) -> Value {
    api.apply(PLAN_PATH, None).await;
    api.apply(SERVICE_PATH, None).await;
    api.apply(COORDINATOR_PATH, None).await;
    let workers = api
        .apply(
            WORKERS_PATH,
            Some(json!({"replicas": 2, "readyReplicas": 2})),
        )
        .await;
    workers["spec"]["template"]["spec"]["containers"][0]["resources"].clone()
}

#[tokio::test]
async fn an_oom_killed_worker_raises_the_workers_memory_within_max_worker_memory() {
    let options = JobOptions {
        num_workers: Some(2),
        max_num_workers: Some(4),
        max_worker_memory: Some("8Gi".into()),
        ..Default::default()
    };
    let pods = vec![
        memory_pod("test-worker-0", "2Gi", false),
        memory_pod("test-worker-1", "2Gi", true),
    ];
    let coordinator = FakeCoordinator::answering(Some(progress(JobPhase::Running)));
    let (result, _) = reconcile_with_pods(
        running_with(options.clone(), 2),
        coordinator,
        pods,
        |mut api| async move {
            let resources = apply_children_resources(&mut api).await;
            assert_eq!(resources["requests"]["memory"], "3Gi", "2Gi × 1.5");
            assert_eq!(resources["limits"]["memory"], "3Gi");
            assert_eq!(resources["requests"]["cpu"], "1", "the rest as configured");
            let status = api.status().await;
            let memory = &status["autoscaling"]["memory"];
            assert_eq!(
                (memory["current"].as_str(), memory["reason"].as_str()),
                (Some("3Gi"), Some("OOMKilled"))
            );
            assert!(memory["lastChange"].is_string());
            let insight = &status["insights"][0];
            assert_eq!(insight["type"], "WORKER_OUT_OF_MEMORY");
            assert_eq!(insight["subject"], "test-worker-1");
            assert!(
                insight["recommendation"]
                    .as_str()
                    .unwrap()
                    .starts_with("The operator raises the workers' memory to 3Gi (options.maxWorkerMemory 8Gi)"),
                "{insight}"
            );
            assert_eq!(condition(&status, "Degraded")["reason"], "WORKER_OUT_OF_MEMORY");
            let (type_, reason, _) = api.event().await;
            assert_eq!((type_.as_str(), reason.as_str()), ("Warning", "WORKER_OUT_OF_MEMORY"));
            let (type_, reason, note) = api.event().await;
            assert_eq!((type_.as_str(), reason.as_str()), ("Warning", "MemoryScaling"));
            assert!(
                note.starts_with("Setting the workers' memory 2Gi -> 3Gi (OOMKilled: worker pod test-worker-1 was killed for running out of memory at 2Gi)"),
                "{note}"
            );
            api
        },
    )
    .await;
    result.unwrap();

    // Dry run (autoscaling_dry_run): recorded and published, the pods keep their memory.
    let dry = JobOptions {
        experiments: vec!["autoscaling_dry_run".into()],
        ..options
    };
    let coordinator = FakeCoordinator::answering(Some(progress(JobPhase::Running)));
    let (result, _) = reconcile_with_pods(
        running_with(dry, 2),
        coordinator,
        vec![memory_pod("test-worker-1", "2Gi", true)],
        |mut api| async move {
            let resources = apply_children_resources(&mut api).await;
            assert_eq!(resources["requests"]["memory"], "2Gi");
            assert!(resources.get("limits").is_none(), "as configured: no limit");
            let status = api.status().await;
            let memory = &status["autoscaling"]["memory"];
            assert_eq!(
                (memory["current"].as_str(), memory["proposed"].as_str()),
                (Some("2Gi"), Some("3Gi"))
            );
            assert_eq!(api.event().await.1, "WORKER_OUT_OF_MEMORY");
            let (_, reason, note) = api.event().await;
            assert_eq!(reason, "MemoryScalingDryRun");
            assert!(note.ends_with("; keeping 2Gi"), "{note}");
            api
        },
    )
    .await;
    result.unwrap();
}

#[tokio::test]
async fn a_max_worker_memory_below_the_workers_memory_is_an_invalid_spec() {
    let options = JobOptions {
        max_worker_memory: Some("1Gi".into()),
        ..Default::default()
    };
    let mut j = job();
    j.spec.options = JobOptions {
        disk_size_gb: Some(10),
        ..options
    };
    let (result, _) = reconcile_with(j, FakeCoordinator::answering(None), |mut api| async move {
        let status = api.status().await;
        assert_eq!(condition(&status, "Ready")["reason"], "InvalidSpec");
        assert_eq!(
            status["message"],
            "Invalid spec: options.maxWorkerMemory 1Gi is less than the workers' memory (2Gi): it bounds how far the operator may raise it"
        );
        assert_eq!(api.event().await.1, "InvalidSpec");
        expect_release(&mut api).await;
        api
    })
    .await;
    assert_eq!(result.unwrap(), Action::await_change());
}

#[tokio::test]
async fn insights_from_the_coordinators_progress_land_in_status_and_events() {
    // A running item of stage S00 at 700 s with no typical item to compare with (600 s bound).
    let mut p = progress(JobPhase::Running);
    p.stages = vec![riverbank_pipeline::progress::StageProgress {
        index: 0,
        name: "S00".into(),
        state: "Running".into(),
        ..Default::default()
    }];
    p.work_items = vec![riverbank_pipeline::progress::WorkItemProgress {
        item: 3,
        stage: 0,
        state: "Running".into(),
        worker: Some("test-worker-0".into()),
        running_secs: 700.0,
        attempts: 1,
        ..Default::default()
    }];
    let (result, _) = reconcile_with(
        running_job(2),
        FakeCoordinator::answering(Some(p)),
        |mut api| async move {
            api.apply_children(2).await;
            let status = api.status().await;
            let insight = &status["insights"][0];
            assert_eq!(
                (insight["type"].as_str(), insight["subject"].as_str()),
                (Some("LONG_WORK_ITEM"), Some("S00/item-3"))
            );
            assert_eq!(
                insight["message"],
                "Stage spending too long on work: work item 3 of stage S00 on test-worker-0 has been running for 700 s"
            );
            assert!(insight["since"].is_string());
            let (type_, reason, note) = api.event().await;
            assert_eq!((type_.as_str(), reason.as_str()), ("Warning", "LONG_WORK_ITEM"));
            assert!(note.contains(" Recommendation: Look for a slow or stuck transform in stage S00"), "{note}");
            api
        },
    )
    .await;
    result.unwrap();
}

#[path = "streaming_tests.rs"]
mod streaming;
