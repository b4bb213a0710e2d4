// Each class of the shared tables (clients/cases/) as the error this client throws.

import {
  BadRequest,
  Forbidden,
  LeaseLost,
  LockHeld,
  TooManyRequests,
  Unauthorized,
  Unavailable,
} from "../src/index.js";

export const classes: Record<string, Function> = {
  held: LockHeld,
  lease_lost: LeaseLost,
  bad_request: BadRequest,
  unauthorized: Unauthorized,
  forbidden: Forbidden,
  too_many_requests: TooManyRequests,
  unavailable: Unavailable,
};
