//! The identity a Function's pods read their revisions' chunk ConfigMaps with.

use super::*;

/// The ServiceAccount (and Role, and RoleBinding) of `function`'s pods where its revisions
/// are in ConfigMaps.
pub fn chunk_reader_name(function: &str) -> String {
    format!("{function}-chunk-reader")
}

/// The chunk ConfigMaps of `module` (the module's and its code's), by name.
pub fn chunk_configmap_names(function: &str, module: &Module) -> Vec<String> {
    let ModuleLocation::ConfigMaps { count } = module.location else {
        return Vec::new();
    };
    let mut names = Part::Module.configmap_names(function, &module.source_digest, count);
    if let Some(code) = &module.code {
        names.extend(Part::Code.configmap_names(function, &module.source_digest, code.chunks));
    }
    names
}

/// The identity `func`'s pods read its revisions' chunks with: a ServiceAccount whose Role
/// may `get` the ConfigMaps `chunks` names and nothing else (the admission policy refuses
/// any other rule under this name), so a revision built after a pod started can be
/// switched to in place.
pub fn chunk_reader_rbac(
    func: &Function,
    chunks: &std::collections::BTreeSet<String>,
) -> (ServiceAccount, Role, RoleBinding) {
    let name = chunk_reader_name(&func.name_any());
    let labels = labels_for(func, "chunk-reader");
    let account = ServiceAccount {
        metadata: meta(func, name.clone(), labels.clone()),
        ..Default::default()
    };
    let role = Role {
        metadata: meta(func, name.clone(), labels.clone()),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["".into()]),
            resources: Some(vec!["configmaps".into()]),
            resource_names: Some(chunks.iter().cloned().collect()),
            verbs: vec!["get".into()],
            ..Default::default()
        }]),
    };
    let binding = crate::objects::own_account_binding(meta(func, name, labels));
    (account, role, binding)
}
