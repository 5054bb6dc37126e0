//! Errors of the controller's shell: API calls, discovery, start-up.

/// Something the controller could not do. Each variant maps to a metrics
/// label and a condition reason.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request to the API server failed.
    #[error("{action} {object}: {source}")]
    Api {
        /// What was attempted: `apply`, `delete`, `get`, `patch status`.
        action: &'static str,
        /// The object, as `Kind [namespace/]name`.
        object: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// The kubeconfig or in-cluster configuration is unusable.
    #[error("cannot build a Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    /// Leader election could not start.
    #[error("leader election: {0}")]
    Lease(#[from] kube_lease_manager::LeaseManagerError),
    /// The leader election task ended: this replica can never lead again.
    #[error("leader election stopped")]
    LeaseLost,
    /// The metrics server could not bind its address.
    #[error("metrics server on {address}: {source}")]
    Serve {
        /// The address.
        address: std::net::SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A desired object could not be serialized or parsed.
    #[error("{object}: {message}")]
    Manifest {
        /// The object.
        object: String,
        /// What is wrong.
        message: String,
    },
}

impl Error {
    /// A short, bounded label for the errors-by-reason metric.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Api { source, .. } => match source {
                kube::Error::Api(s) if s.code == 409 => "api_conflict",
                kube::Error::Api(s) if s.code == 403 => "api_forbidden",
                kube::Error::Api(s) if s.code == 404 => "api_not_found",
                kube::Error::Api(s) if s.code == 422 => "api_invalid",
                kube::Error::Api(_) => "api_error",
                _ => "api_transport",
            },
            Error::Client(_) => "client",
            Error::Lease(_) | Error::LeaseLost => "lease",
            Error::Serve { .. } => "serve",
            Error::Manifest { .. } => "manifest",
        }
    }

    /// The CamelCase reason used in conditions and Events.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Api { source, .. } => match source {
                kube::Error::Api(s) if s.code == 403 => "Forbidden",
                kube::Error::Api(s) if s.code == 422 => "Invalid",
                _ => "ApiError",
            },
            Error::Manifest { .. } => "InvalidOutput",
            _ => "InternalError",
        }
    }

    /// Whether the API server said the object is gone or changed under a
    /// precondition (a delete that lost a race): not a failure to report.
    pub fn is_gone_or_changed(&self) -> bool {
        matches!(self, Error::Api { source: kube::Error::Api(s), .. } if s.code == 404 || s.code == 409)
    }
}
