//! Decoding a Kafka request frame: the pure half of serving it, with no
//! shard, socket or log involved. `api::handle` serves what [`Request::decode`]
//! gives, and the `kafka_request` fuzz check drives [`decode_frame`].

use super::SUPPORTED;
use bytes::Bytes;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::Decodable;

/// A supported request's decoded body.
#[allow(clippy::large_enum_variant, reason = "decoded once per request and matched at once")]
#[derive(Debug)]
pub enum Request {
    /// Its body (client software name and version, from v3) is not used.
    ApiVersions,
    Metadata(MetadataRequest),
    Produce(ProduceRequest),
    Fetch(FetchRequest),
    ListOffsets(ListOffsetsRequest),
    CreateTopics(CreateTopicsRequest),
    DeleteTopics(DeleteTopicsRequest),
    DescribeConfigs(DescribeConfigsRequest),
    InitProducerId(InitProducerIdRequest),
    FindCoordinator(FindCoordinatorRequest),
    JoinGroup(JoinGroupRequest),
    SyncGroup(SyncGroupRequest),
    Heartbeat(HeartbeatRequest),
    LeaveGroup(LeaveGroupRequest),
    OffsetCommit(OffsetCommitRequest),
    OffsetFetch(OffsetFetchRequest),
    ListGroups(ListGroupsRequest),
    DescribeGroups(DescribeGroupsRequest),
    DeleteGroups(DeleteGroupsRequest),
}

impl Request {
    /// Decodes the body of an `api` request at `version` (a supported pair).
    pub fn decode(api: ApiKey, version: i16, body: &mut Bytes) -> anyhow::Result<Request> {
        Ok(match api {
            ApiKey::ApiVersions => Request::ApiVersions,
            ApiKey::Metadata => Request::Metadata(MetadataRequest::decode(body, version)?),
            ApiKey::Produce => Request::Produce(ProduceRequest::decode(body, version)?),
            ApiKey::Fetch => Request::Fetch(FetchRequest::decode(body, version)?),
            ApiKey::ListOffsets => Request::ListOffsets(ListOffsetsRequest::decode(body, version)?),
            ApiKey::CreateTopics => Request::CreateTopics(CreateTopicsRequest::decode(body, version)?),
            ApiKey::DeleteTopics => Request::DeleteTopics(DeleteTopicsRequest::decode(body, version)?),
            ApiKey::DescribeConfigs => {
                Request::DescribeConfigs(DescribeConfigsRequest::decode(body, version)?)
            }
            ApiKey::InitProducerId => Request::InitProducerId(InitProducerIdRequest::decode(body, version)?),
            ApiKey::FindCoordinator => {
                Request::FindCoordinator(FindCoordinatorRequest::decode(body, version)?)
            }
            ApiKey::JoinGroup => Request::JoinGroup(JoinGroupRequest::decode(body, version)?),
            ApiKey::SyncGroup => Request::SyncGroup(SyncGroupRequest::decode(body, version)?),
            ApiKey::Heartbeat => Request::Heartbeat(HeartbeatRequest::decode(body, version)?),
            ApiKey::LeaveGroup => Request::LeaveGroup(LeaveGroupRequest::decode(body, version)?),
            ApiKey::OffsetCommit => Request::OffsetCommit(OffsetCommitRequest::decode(body, version)?),
            ApiKey::OffsetFetch => Request::OffsetFetch(OffsetFetchRequest::decode(body, version)?),
            ApiKey::ListGroups => Request::ListGroups(ListGroupsRequest::decode(body, version)?),
            ApiKey::DescribeGroups => Request::DescribeGroups(DescribeGroupsRequest::decode(body, version)?),
            ApiKey::DeleteGroups => Request::DeleteGroups(DeleteGroupsRequest::decode(body, version)?),
            other => anyhow::bail!("{other:?} has no decoder"),
        })
    }
}

/// Decodes a whole request frame (without its length prefix) as the
/// listener does: the API key and version words, the request header, the
/// body. `Err` says why the listener would close the connection.
pub fn decode_frame(mut frame: Bytes) -> Result<(ApiKey, i16, RequestHeader, Request), String> {
    if frame.len() < 8 {
        return Err(format!("a request frame of {} bytes is shorter than its header", frame.len()));
    }
    let key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let Some((api, min, max)) = SUPPORTED.iter().copied().find(|(k, _, _)| *k as i16 == key) else {
        return Err(format!("API key {key} is not supported"));
    };
    if version < min || version > max {
        return Err(format!("{api:?} version {version} is not supported"));
    }
    let header = RequestHeader::decode(&mut frame, api.request_header_version(version))
        .map_err(|e| format!("bad request header: {e}"))?;
    let body = Request::decode(api, version, &mut frame).map_err(|e| format!("{api:?} v{version}: {e}"))?;
    Ok((api, version, header, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ApiVersions v`version` with client id "c" (request header v1; v2
    /// for the flexible v3: a tag buffer after the header and the body).
    fn api_versions(version: i16) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&18i16.to_be_bytes());
        f.extend_from_slice(&version.to_be_bytes());
        f.extend_from_slice(&7i32.to_be_bytes());
        f.extend_from_slice(&1i16.to_be_bytes());
        f.push(b'c');
        if version >= 3 {
            f.push(0); // header tags
            f.extend_from_slice(&[2, b'k', 2, b'1', 0]); // software name, version, tags
        }
        f
    }

    #[test]
    fn frames_decode_or_are_refused_with_a_reason() {
        for v in 0..=3 {
            let (api, version, header, body) = decode_frame(Bytes::from(api_versions(v))).expect("decodes");
            assert_eq!((api, version, header.correlation_id), (ApiKey::ApiVersions, v, 7));
            assert!(matches!(body, Request::ApiVersions));
        }
        let whole = api_versions(3);
        for cut in 0..whole.len() - 5 {
            assert!(decode_frame(Bytes::from(whole[..cut].to_vec())).is_err(), "cut at {cut}");
        }
        let mut unknown = api_versions(0);
        unknown[..2].copy_from_slice(&999i16.to_be_bytes());
        assert!(decode_frame(Bytes::from(unknown)).unwrap_err().contains("not supported"));
        let mut too_new = api_versions(0);
        too_new[2..4].copy_from_slice(&4i16.to_be_bytes());
        assert!(decode_frame(Bytes::from(too_new)).unwrap_err().contains("version 4"));
        // A Metadata v1 request with a topic array announcing 2^31-1 entries
        // and no bytes for them is refused, not allocated.
        let mut m = Vec::new();
        m.extend_from_slice(&3i16.to_be_bytes());
        m.extend_from_slice(&1i16.to_be_bytes());
        m.extend_from_slice(&1i32.to_be_bytes());
        m.extend_from_slice(&(-1i16).to_be_bytes());
        m.extend_from_slice(&i32::MAX.to_be_bytes());
        assert!(decode_frame(Bytes::from(m)).is_err());
    }
}
