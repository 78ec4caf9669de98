//! The few messages of the CSI spec (v1.9.0, the version the kubelet vendors) and of the
//! kubelet's plugin registration (`pluginregistration/v1/api.proto`) that the agent reads
//! or answers, with their fields' numbers from those files. Fields the agent does not read
//! are left out: protobuf skips them (a request's `secrets` never reach the agent's memory
//! as values it keeps).

use std::collections::HashMap;

/// `pluginregistration.PluginInfo`, the answer to `Registration/GetInfo`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PluginInfo {
    #[prost(string, tag = "1")]
    pub r#type: String,
    #[prost(string, tag = "2")]
    pub name: String,
    /// Empty: the registration socket serves CSI itself.
    #[prost(string, tag = "3")]
    pub endpoint: String,
    #[prost(string, repeated, tag = "4")]
    pub supported_versions: Vec<String>,
}

/// `pluginregistration.RegistrationStatus`: the kubelet's word on the registration.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RegistrationStatus {
    #[prost(bool, tag = "1")]
    pub plugin_registered: bool,
    #[prost(string, tag = "2")]
    pub error: String,
}

/// Any empty message: `InfoRequest`, `RegistrationStatusResponse`, `NodeGetInfoRequest`,
/// `NodeUnpublishVolumeResponse`, ...
#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

/// `csi.v1.GetPluginInfoResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetPluginInfoResponse {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub vendor_version: String,
}

/// `google.protobuf.BoolValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct BoolValue {
    #[prost(bool, tag = "1")]
    pub value: bool,
}

/// `csi.v1.ProbeResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProbeResponse {
    #[prost(message, optional, tag = "1")]
    pub ready: Option<BoolValue>,
}

/// `csi.v1.NodeGetInfoResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeGetInfoResponse {
    #[prost(string, tag = "1")]
    pub node_id: String,
}

/// `csi.v1.NodePublishVolumeRequest`, the fields the agent reads.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodePublishVolumeRequest {
    #[prost(string, tag = "1")]
    pub volume_id: String,
    #[prost(string, tag = "4")]
    pub target_path: String,
    #[prost(bool, tag = "6")]
    pub readonly: bool,
    #[prost(map = "string, string", tag = "8")]
    pub volume_context: HashMap<String, String>,
}

/// `csi.v1.NodeUnpublishVolumeRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeUnpublishVolumeRequest {
    #[prost(string, tag = "1")]
    pub volume_id: String,
    #[prost(string, tag = "2")]
    pub target_path: String,
}
