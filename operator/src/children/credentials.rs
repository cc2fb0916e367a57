//! Credentials: Secret keys given to the pods as environment variables or as read-only files,
//! by reference only (the operator never reads a Secret).
use super::*;
use crate::crd::SecretCredential;
use k8s_openapi::api::core::v1::{
    KeyToPath, ProjectedVolumeSource, SecretProjection, VolumeProjection,
};

/// Mount points the pods use themselves; credential files may not shadow them.
const RESERVED_DIRS: &[&str] = &["/tmp", PLAN_DIR, DATA_DIR];
/// System directories a credential volume must not hide (CA certificates, libraries).
const SYSTEM_DIRS: &[&str] = &[
    "/bin", "/boot", "/dev", "/etc/ssl", "/lib", "/lib64", "/proc", "/sbin", "/sys", "/usr",
];

/// Credential files, grouped by directory: one read-only projected volume per directory, so
/// several keys (of one or more Secrets) can sit side by side, and rotated Secrets show up
/// without a restart (which subPath mounts would prevent).
pub(super) fn credential_volumes(
    credentials: &[SecretCredential],
) -> Result<(Vec<Volume>, Vec<VolumeMount>), ChildrenError> {
    let mut by_dir: BTreeMap<String, Vec<(&SecretCredential, String)>> = BTreeMap::new();
    let mut files = BTreeSet::new();
    for c in credentials {
        let Some(path) = &c.path else { continue };
        let bad = |reason| ChildrenError::CredentialPath {
            path: path.clone(),
            reason,
        };
        if !path.starts_with('/') || path.ends_with('/') {
            return Err(bad("must be an absolute file path"));
        }
        if path.split('/').any(|s| s == "." || s == "..") {
            return Err(bad("must not contain '.' or '..' segments"));
        }
        let (dir, file) = path.rsplit_once('/').expect("starts with '/'");
        if dir.is_empty() || dir.matches('/').count() < 2 {
            return Err(bad(
                "must be in a directory at least two levels deep, e.g. /var/run/secrets/NAME/FILE (the directory is replaced by a volume)",
            ));
        }
        let under = |root: &str| dir == root || dir.starts_with(&format!("{root}/"));
        if RESERVED_DIRS.iter().any(|r| under(r)) {
            return Err(bad(
                "is under /tmp, /etc/riverbank or /var/lib/riverbank, which the pods use themselves",
            ));
        }
        if SYSTEM_DIRS.iter().any(|r| under(r)) {
            return Err(bad("would hide a system directory of the image"));
        }
        if !files.insert(path.clone()) {
            return Err(bad("is used by more than one credential"));
        }
        by_dir
            .entry(dir.to_string())
            .or_default()
            .push((c, file.to_string()));
    }
    let mut volumes = vec![];
    let mut mounts = vec![];
    for (i, (dir, entries)) in by_dir.into_iter().enumerate() {
        let name = format!("credentials-{i}");
        // One source per Secret, keys in the order the user listed them.
        let mut sources: Vec<SecretProjection> = vec![];
        for (c, file) in entries {
            let item = KeyToPath {
                key: c.key.clone(),
                path: file,
                mode: None,
            };
            match sources.iter_mut().find(|s| s.name == c.name) {
                Some(s) => s.items.get_or_insert_with(Vec::new).push(item),
                None => sources.push(SecretProjection {
                    name: c.name.clone(),
                    items: Some(vec![item]),
                    optional: Some(false),
                }),
            }
        }
        volumes.push(Volume {
            name: name.clone(),
            projected: Some(ProjectedVolumeSource {
                // Readable by the pod's group (fsGroup) only.
                default_mode: Some(0o440),
                sources: Some(
                    sources
                        .into_iter()
                        .map(|s| VolumeProjection {
                            secret: Some(s),
                            ..Default::default()
                        })
                        .collect(),
                ),
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name,
            mount_path: dir,
            read_only: Some(true),
            ..Default::default()
        });
    }
    Ok((volumes, mounts))
}
