//! The reconciler's writes to the API server: server-side apply of the children and of status
//! under one field manager, the replicas of an invalid job's StatefulSets, JSON patches of the
//! job's finalizers.
use super::context::{Context, Error};
use crate::children::Children;
use crate::crd::{DataflowJob, DataflowJobStatus};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt::Debug;

/// The one field manager of everything the operator writes (children and status).
pub const FIELD_MANAGER: &str = "riverbank-operator";
/// The field manager of the replicas of an invalid job's StatefulSets (see `scale_to_zero`).
pub const STOP_FIELD_MANAGER: &str = "riverbank-operator-stop";

/// Scales a StatefulSet that may not exist to zero replicas (its disks stay): a server-side
/// apply of the replicas alone, under [`STOP_FIELD_MANAGER`]. (Under the main field manager a
/// partial apply would give up every other field it owns, and so delete them.) The next full
/// apply of the children takes the replicas back (`force`).
pub async fn scale_to_zero(ctx: &Context, namespace: &str, name: &str) -> Result<(), Error> {
    let api: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), namespace);
    if api.get_opt(name).await?.is_none() {
        return Ok(());
    }
    let patch = serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "spec": {"replicas": 0},
    });
    let params = PatchParams::apply(STOP_FIELD_MANAGER).force();
    match api.patch(name, &params, &Patch::Apply(&patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Server-side applies the children in dependency order; returns the worker StatefulSet as
/// the API server has it (its status says how many workers are ready).
pub async fn apply_children(
    ctx: &Context,
    namespace: &str,
    children: Children,
) -> Result<StatefulSet, Error> {
    apply(ctx, namespace, &children.plan).await?;
    apply(ctx, namespace, &children.service).await?;
    if let Some(policy) = &children.network_policy {
        apply(ctx, namespace, policy).await?;
    }
    apply(ctx, namespace, &children.coordinator).await?;
    apply(ctx, namespace, &children.workers).await
}

async fn apply<K>(ctx: &Context, namespace: &str, object: &K) -> Result<K, Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Serialize
        + DeserializeOwned
        + Debug,
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), namespace);
    let name = object.meta().name.clone().expect("children are named");
    // force: this operator is the owner of these fields; take them back from anyone who
    // changed them (drift is undone).
    let params = PatchParams::apply(FIELD_MANAGER).force();
    Ok(api.patch(&name, &params, &Patch::Apply(object)).await?)
}

/// Server-side applies `status` through the status subresource.
pub async fn status(
    ctx: &Context,
    job: &DataflowJob,
    namespace: &str,
    status: &DataflowJobStatus,
) -> Result<(), Error> {
    let api: Api<DataflowJob> = Api::namespaced(ctx.client.clone(), namespace);
    let patch = serde_json::json!({
        "apiVersion": DataflowJob::api_version(&()),
        "kind": DataflowJob::kind(&()),
        "status": status,
    });
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch_status(&job.name_any(), &params, &Patch::Apply(&patch))
        .await?;
    Ok(())
}

pub async fn json_patch(
    ctx: &Context,
    job: &DataflowJob,
    namespace: &str,
    patch: serde_json::Value,
) -> Result<(), Error> {
    let api: Api<DataflowJob> = Api::namespaced(ctx.client.clone(), namespace);
    let patch: json_patch::Patch = serde_json::from_value(patch).expect("a well-formed JSON patch");
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    api.patch(&job.name_any(), &params, &Patch::Json::<()>(patch))
        .await?;
    Ok(())
}
