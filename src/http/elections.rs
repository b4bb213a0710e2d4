//! An election's own route: observe, a stream of leadership changes. An election is a
//! lock of its own kind (the fencing token is the term, the owner text the leader's value):
//! campaign, leader, proclaim, resign and depose are the operations every kind shares
//! (`kinds`).

use axum::extract::State;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::ApiError;
use super::extract::{ElectionPath, Fields};
use super::schema::Refusals;
use super::stream;
use crate::model::LockName;
use crate::wire::NoFields;

/// Observe: a stream of leadership changes, starting with the current state.
#[utoipa::path(
    get, path = "/elections/{name}/observe", tag = "elections",
    params(("name" = inline(LockName), Path)),
    responses(
        Refusals,
        (status = 200, content_type = "text/event-stream", body = crate::wire::ObserveStreamData,
            description = "First the current state, then each change, as `LeaderEvent`s: `elected` (a new term, with its value), \
`proclaimed` (the leader's new value, same term), `vacant` (`term` is the last leader's). Terms never go back. \
An observer more than 16 events behind is disconnected; on reconnecting it is told the current state. \
When the replica stops, the stream ends with `closed` (a `LostEvent`, reason `shutting_down`): reconnect, to another replica."),
    )
)]
pub(crate) async fn observe(
    State(state): State<AppState>,
    ElectionPath(name): ElectionPath,
    Fields(NoFields {}): Fields<NoFields>,
) -> Result<Response, ApiError> {
    let shown = name.as_str().to_owned();
    let changes = state.service.observe(name)?;
    Ok(stream::observe(shown, changes).into_response())
}
