//! Client-visible error codes. The numbers are defined in `fbs/shardlog.fbs`
//! (`enum ErrorCode`) and are stable: values are only ever appended.

pub use crate::wire::ErrorCode;

/// Whether a client should retry a request that failed with this code
/// (after refreshing metadata where relevant).
#[must_use]
pub fn is_retriable(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::NotLeaderOrFollower
            | ErrorCode::LeaderNotAvailable
            | ErrorCode::NotEnoughReplicas
            | ErrorCode::FencedLeaderEpoch
            | ErrorCode::RequestTimedOut
            | ErrorCode::BrokerShuttingDown
            | ErrorCode::TooManyInFlight
            | ErrorCode::ResourceLimit
            | ErrorCode::UnknownTopicOrPartition
            | ErrorCode::CoordinatorNotAvailable
            | ErrorCode::NotCoordinator
    )
}

/// A short human name for a code, for logs and CLI messages.
#[must_use]
pub fn name(code: ErrorCode) -> &'static str {
    code.variant_name().unwrap_or("UnknownErrorCode")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_stable() {
        // These numbers are part of the wire contract.
        assert_eq!(ErrorCode::None.0, 0);
        assert_eq!(ErrorCode::CorruptMessage.0, 2);
        assert_eq!(ErrorCode::UnknownTopicOrPartition.0, 3);
        assert_eq!(ErrorCode::OffsetOutOfRange.0, 4);
        assert_eq!(ErrorCode::StorageError.0, 14);
        assert_eq!(ErrorCode::ResourceLimit.0, 19);
        assert_eq!(ErrorCode::CoordinatorNotAvailable.0, 20);
        assert_eq!(ErrorCode::OffsetMetadataTooLarge.0, 32);
        assert_eq!(name(ErrorCode::OffsetOutOfRange), "OffsetOutOfRange");
    }
}
