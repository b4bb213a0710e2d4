// A TypeScript client generated from the OpenAPI document reads naturally: each operation
// has one success shape, so `data.fencing_token` of a grant needs no cast (with the held
// stream's 200 beside the 201 it was `string | LeaseBody`). Generates the types with
// openapi-typescript from openapi/openapi.json and type-checks test/generated/use.ts.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { copyFileSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

const here = fileURLToPath(new URL("..", import.meta.url));
const bin = (name) => join(here, "node_modules", ".bin", name);

test("a client generated from the document reads each success without a cast", () => {
  const dir = mkdtempSync(join(tmpdir(), "redlockd-generated-"));
  try {
    execFileSync(bin("openapi-typescript"), [
      join(here, "..", "..", "openapi", "openapi.json"),
      "-o",
      join(dir, "schema.d.ts"),
    ], { stdio: "pipe" });
    copyFileSync(join(here, "test", "generated", "use.ts"), join(dir, "use.ts"));
    symlinkSync(join(here, "node_modules"), join(dir, "node_modules"));
    writeFileSync(join(dir, "tsconfig.json"), JSON.stringify({
      compilerOptions: {
        target: "ES2022", module: "NodeNext", moduleResolution: "NodeNext", strict: true,
        noEmit: true, skipLibCheck: true, lib: ["ES2022", "DOM"],
      },
      files: ["use.ts"],
    }));
    let output = "";
    try {
      execFileSync(bin("tsc"), ["-p", dir], { stdio: "pipe" });
    } catch (e) {
      output = `${e.stdout}${e.stderr}`;
    }
    assert.equal(output, "", "the generated client needs a cast");
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
