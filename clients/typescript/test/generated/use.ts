// A client generated from the OpenAPI document (openapi-typescript + openapi-fetch) reads
// each operation's success without a cast: test/generated.test.mjs type-checks this file
// against types generated from openapi/openapi.json.

import createClient from "openapi-fetch";
import type { paths } from "./schema.js";

const client = createClient<paths>({ baseUrl: "http://localhost:8080" });

export async function grant(): Promise<number> {
  const { data, error } = await client.POST("/locks/{name}", {
    params: { path: { name: "report" }, query: { ttl_ms: 5000 } },
    body: { wait_ms: 1000 },
  });
  if (error) throw new Error(error.message);
  return data.fencing_token;
}

export async function renew(id: string): Promise<string> {
  const { data, error } = await client.PUT("/locks/{name}/leases/{lease_id}", {
    params: { path: { name: "report", lease_id: id } },
  });
  if (error) throw new Error(error.error);
  return data.expires_at;
}

export async function leader(): Promise<number | undefined> {
  const { data } = await client.GET("/elections/{name}", { params: { path: { name: "e" } } });
  return data?.term ?? undefined;
}
