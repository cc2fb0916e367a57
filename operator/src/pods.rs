//! Why a job's pods are not running: the few states that otherwise leave a job silently
//! Pending (an image that can't be pulled, a container that keeps crashing, a pod no node
//! takes), read from the pods' status as the kubelet and scheduler report them.
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

/// One pod that needs the user's attention.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodProblem {
    pub pod: String,
    /// The kubelet's or scheduler's reason, e.g. ImagePullBackOff, CrashLoopBackOff, Unschedulable.
    pub reason: String,
    pub message: String,
}

impl PodProblem {
    /// One line for status.message and the Degraded condition.
    pub fn summary(&self) -> String {
        if self.message.is_empty() {
            format!("pod {}: {}", self.pod, self.reason)
        } else {
            format!("pod {}: {}: {}", self.pod, self.reason, self.message)
        }
    }
}

/// Container waiting reasons that will not fix themselves, worst first. (ContainerCreating and
/// PodInitializing are normal steps; ErrImagePull turns into ImagePullBackOff.)
const STUCK: &[&str] = &[
    "CreateContainerConfigError", // e.g. a credential's Secret or key does not exist
    "InvalidImageName",
    "ImagePullBackOff",
    "ErrImagePull",
    "CrashLoopBackOff",
    "CreateContainerError",
    "RunContainerError",
];

/// The most important problem among `pods`, if any: stuck containers first (in the order of
/// [`STUCK`]), then pods the scheduler can't place. Ties go to the first pod by name, so the
/// reported problem is stable from one reconcile to the next.
pub fn diagnose<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Option<PodProblem> {
    let mut found: Vec<(usize, PodProblem)> = vec![];
    for pod in pods {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let Some(status) = &pod.status else { continue };
        let containers = status
            .init_container_statuses
            .iter()
            .flatten()
            .chain(status.container_statuses.iter().flatten());
        for c in containers {
            let Some(waiting) = c.state.as_ref().and_then(|s| s.waiting.as_ref()) else {
                continue;
            };
            let reason = waiting.reason.clone().unwrap_or_default();
            if let Some(rank) = STUCK.iter().position(|s| *s == reason) {
                let mut message = waiting.message.clone().unwrap_or_default();
                if reason == "CrashLoopBackOff" {
                    message = crash_message(c).unwrap_or(message);
                }
                found.push((
                    rank,
                    PodProblem {
                        pod: pod.name_any(),
                        reason,
                        message: one_line(&message),
                    },
                ));
            }
        }
        if status.phase.as_deref() == Some("Pending") {
            let unschedulable = status.conditions.iter().flatten().find(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            });
            if let Some(c) = unschedulable {
                found.push((
                    STUCK.len(),
                    PodProblem {
                        pod: pod.name_any(),
                        reason: "Unschedulable".into(),
                        message: one_line(c.message.as_deref().unwrap_or_default()),
                    },
                ));
            }
        }
    }
    found
        .into_iter()
        .min_by(|a, b| (a.0, &a.1.pod).cmp(&(b.0, &b.1.pod)))
        .map(|(_, p)| p)
}

/// For a crash loop the useful part is how the last run ended (exit code, termination message).
fn crash_message(c: &k8s_openapi::api::core::v1::ContainerStatus) -> Option<String> {
    let last = c.last_state.as_ref()?.terminated.as_ref()?;
    let mut text = format!(
        "container {} exited with code {} ({} restarts)",
        c.name, last.exit_code, c.restart_count
    );
    if let Some(m) = last.message.as_deref().filter(|m| !m.trim().is_empty()) {
        text.push_str(": ");
        text.push_str(m.trim());
    }
    Some(text)
}

/// Status messages are single lines of bounded length.
fn one_line(text: &str) -> String {
    let mut line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.len() > 300 {
        let mut end = 297;
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        line.truncate(end);
        line.push_str("...");
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name}, "status": status})).unwrap()
    }

    fn waiting(reason: &str, message: &str) -> serde_json::Value {
        json!({"phase": "Pending", "containerStatuses": [{
            "name": "worker", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": reason, "message": message}}}]})
    }

    #[test]
    fn healthy_and_starting_pods_are_no_problem() {
        let running = pod(
            "j-worker-0",
            json!({"phase": "Running", "containerStatuses": [{"name": "worker", "image": "i",
                "imageID": "", "ready": true, "restartCount": 0, "state": {"running": {}}}]}),
        );
        let creating = pod("j-worker-1", waiting("ContainerCreating", ""));
        assert_eq!(diagnose([&running, &creating]), None);
    }

    #[test]
    fn image_pull_back_off_is_reported() {
        let p = pod(
            "j-worker-1",
            waiting(
                "ImagePullBackOff",
                "Back-off pulling image \"nope:1\"\n  retrying",
            ),
        );
        let problem = diagnose([&p]).unwrap();
        assert_eq!(problem.reason, "ImagePullBackOff");
        assert_eq!(
            problem.summary(),
            "pod j-worker-1: ImagePullBackOff: Back-off pulling image \"nope:1\" retrying"
        );
    }

    #[test]
    fn crash_loops_say_how_the_container_ended() {
        let p = pod(
            "j-coordinator-0",
            json!({"phase": "Running", "containerStatuses": [{"name": "coordinator", "image": "i",
                "imageID": "", "ready": false, "restartCount": 4,
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 1m20s"}},
                "lastState": {"terminated": {"exitCode": 2, "message": "no such plan\n"}}}]}),
        );
        assert_eq!(
            diagnose([&p]).unwrap().message,
            "container coordinator exited with code 2 (4 restarts): no such plan"
        );
    }

    #[test]
    fn unschedulable_pods_are_reported_after_stuck_containers() {
        let unschedulable = pod(
            "j-worker-0",
            json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient memory."}]}),
        );
        assert_eq!(
            diagnose([&unschedulable]).unwrap().summary(),
            "pod j-worker-0: Unschedulable: 0/3 nodes are available: 3 Insufficient memory."
        );
        let crashing = pod("j-worker-2", waiting("CrashLoopBackOff", "back-off"));
        let missing_secret = pod(
            "j-worker-3",
            waiting("CreateContainerConfigError", "secret \"s3\" not found"),
        );
        let worst = diagnose([&unschedulable, &crashing, &missing_secret]).unwrap();
        assert_eq!(worst.reason, "CreateContainerConfigError");
        assert_eq!(
            diagnose([&crashing, &unschedulable]).unwrap().reason,
            "CrashLoopBackOff"
        );
    }
}
