//! The coordinator's requests and answers as owned values: decoded once from
//! the wire (`dispatch/group.rs`, later the Kafka listener), `Send` so that
//! they cross the shard mesh to the coordinating shard.

use shardlog_schema::ErrorCode;
use std::time::Duration;

/// A typed, client-visible failure of a group operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupError {
    pub code: ErrorCode,
    pub message: String,
}

impl GroupError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        GroupError { code, message: message.into() }
    }
}

impl std::fmt::Display for GroupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", shardlog_schema::error::name(self.code), self.message)
    }
}

pub type GroupResult<T> = Result<T, GroupError>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Protocol {
    pub name: String,
    pub metadata: Vec<u8>,
}

#[derive(Debug, Clone)]
pub struct JoinGroup {
    pub group_id: String,
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout: Duration,
    pub rebalance_timeout: Duration,
    pub protocol_type: String,
    pub protocols: Vec<Protocol>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinMember {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub metadata: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Joined {
    pub generation: i32,
    pub protocol_type: String,
    pub protocol: String,
    pub leader: String,
    pub member_id: String,
    /// Only for the leader.
    pub members: Vec<JoinMember>,
    pub skip_assignment: bool,
}

#[derive(Debug, Clone)]
pub struct SyncGroup {
    pub group_id: String,
    pub generation: i32,
    pub member_id: String,
    pub instance_id: Option<String>,
    pub assignments: Vec<(String, Vec<u8>)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Synced {
    pub protocol_type: String,
    pub protocol: String,
    pub assignment: Vec<u8>,
}

#[derive(Debug, Clone)]
pub struct Heartbeat {
    pub group_id: String,
    pub generation: i32,
    pub member_id: String,
    pub instance_id: Option<String>,
}

#[derive(Debug, Clone)]
pub struct LeaveMember {
    pub member_id: String,
    pub instance_id: Option<String>,
}

#[derive(Debug, Clone)]
pub struct LeaveGroup {
    pub group_id: String,
    pub members: Vec<LeaveMember>,
}

#[derive(Debug, Clone)]
pub struct CommitPartition {
    pub topic: String,
    pub partition: u32,
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: String,
}

#[derive(Debug, Clone)]
pub struct OffsetCommit {
    pub group_id: String,
    /// -1 with an empty member id: a commit from outside the group (tools),
    /// accepted only while the group has no members.
    pub generation: i32,
    pub member_id: String,
    pub instance_id: Option<String>,
    pub partitions: Vec<CommitPartition>,
}

/// The outcome of one partition of a commit.
#[derive(Debug, Clone)]
pub struct CommitOutcome {
    pub topic: String,
    pub partition: u32,
    pub result: GroupResult<()>,
}

#[derive(Debug, Clone)]
pub struct OffsetFetch {
    pub group_id: String,
    /// `None`: every partition the group has an offset for.
    pub partitions: Option<Vec<(String, u32)>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedOffset {
    pub topic: String,
    pub partition: u32,
    /// -1: nothing committed.
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: String,
    /// The partition's high watermark, -1 when unknown.
    pub log_end_offset: i64,
    pub error: Option<GroupError>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedGroup {
    pub group_id: String,
    pub protocol_type: String,
    pub state: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribedMember {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub metadata: Vec<u8>,
    pub assignment: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribedGroup {
    pub group_id: String,
    pub state: &'static str,
    pub protocol_type: String,
    pub protocol: String,
    pub generation: i32,
    pub leader: String,
    pub members: Vec<DescribedMember>,
}

/// One committed offset and its lag, for `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupLag {
    pub group_id: String,
    pub topic: String,
    pub partition: u32,
    pub committed: i64,
}

/// A request for a group's coordinator.
#[derive(Debug, Clone)]
pub enum GroupRequest {
    Join(JoinGroup),
    Sync(SyncGroup),
    Heartbeat(Heartbeat),
    Leave(LeaveGroup),
    Commit(OffsetCommit),
    FetchOffsets(OffsetFetch),
    Describe(String),
    Delete(String),
}

impl GroupRequest {
    /// The group the request is about: it decides the coordinator.
    #[must_use]
    pub fn group_id(&self) -> &str {
        match self {
            GroupRequest::Join(r) => &r.group_id,
            GroupRequest::Sync(r) => &r.group_id,
            GroupRequest::Heartbeat(r) => &r.group_id,
            GroupRequest::Leave(r) => &r.group_id,
            GroupRequest::Commit(r) => &r.group_id,
            GroupRequest::FetchOffsets(r) => &r.group_id,
            GroupRequest::Describe(g) | GroupRequest::Delete(g) => g,
        }
    }
}

#[derive(Debug, Clone)]
pub enum GroupResponse {
    Join(GroupResult<Joined>),
    Sync(GroupResult<Synced>),
    Heartbeat(GroupResult<()>),
    /// Whole-request error, or one result per member.
    Leave(GroupResult<Vec<(LeaveMember, GroupResult<()>)>>),
    Commit(GroupResult<Vec<CommitOutcome>>),
    FetchOffsets(GroupResult<Vec<FetchedOffset>>),
    Describe(GroupResult<DescribedGroup>),
    Delete(GroupResult<()>),
}

/// Which group API a request or answer belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupApi {
    Join,
    Sync,
    Heartbeat,
    Leave,
    Commit,
    FetchOffsets,
    Describe,
    Delete,
}

impl GroupRequest {
    #[must_use]
    pub fn api(&self) -> GroupApi {
        match self {
            GroupRequest::Join(_) => GroupApi::Join,
            GroupRequest::Sync(_) => GroupApi::Sync,
            GroupRequest::Heartbeat(_) => GroupApi::Heartbeat,
            GroupRequest::Leave(_) => GroupApi::Leave,
            GroupRequest::Commit(_) => GroupApi::Commit,
            GroupRequest::FetchOffsets(_) => GroupApi::FetchOffsets,
            GroupRequest::Describe(_) => GroupApi::Describe,
            GroupRequest::Delete(_) => GroupApi::Delete,
        }
    }
}

impl GroupResponse {
    /// A failure as the answer to a request of `api`.
    #[must_use]
    pub fn error(api: GroupApi, e: GroupError) -> GroupResponse {
        match api {
            GroupApi::Join => GroupResponse::Join(Err(e)),
            GroupApi::Sync => GroupResponse::Sync(Err(e)),
            GroupApi::Heartbeat => GroupResponse::Heartbeat(Err(e)),
            GroupApi::Leave => GroupResponse::Leave(Err(e)),
            GroupApi::Commit => GroupResponse::Commit(Err(e)),
            GroupApi::FetchOffsets => GroupResponse::FetchOffsets(Err(e)),
            GroupApi::Describe => GroupResponse::Describe(Err(e)),
            GroupApi::Delete => GroupResponse::Delete(Err(e)),
        }
    }
}
