"""The shared table of failover (clients/cases/failover.json): every client goes round the
replicas the same way."""

import asyncio
import json
import pathlib

import httpx
import pytest

import redlockd

from test_cases import CLASSES

TABLE = json.loads(
    (pathlib.Path(__file__).resolve().parents[2] / "cases" / "failover.json").read_text()
)



def replicas(case, tried):
    """A transport that answers as the case's replicas do, and records which it asked."""
    answers = [list(r) for r in case["replicas"]]

    def handle(request: httpx.Request) -> httpx.Response:
        i = int(request.url.host.removeprefix("replica-"))
        tried.append(i)
        answer = answers[i].pop(0) if len(answers[i]) > 1 else answers[i][0]
        if answer == "refused":
            raise httpx.ConnectError("connection refused", request=request)
        if answer == "ok":
            return httpx.Response(200, json=TABLE["ok_body"])
        return httpx.Response(answer["status"], json=answer["body"])

    return httpx.MockTransport(handle)


@pytest.mark.parametrize("case", TABLE["cases"], ids=lambda c: c["name"])
def test_each_client_goes_round_the_replicas_as_the_table_says(case):
    tried = []
    urls = [f"http://replica-{i}" for i in range(len(case["replicas"]))]
    http = httpx.Client(transport=replicas(case, tried))
    with redlockd.Client(urls, http=http) as client:
        for call in case["calls"]:
            tried.clear()
            if call["result"] == "ok":
                status = client.inspect("job")
                assert status.held and status.fencing_token == 7
            else:
                with pytest.raises(redlockd.RedlockdError) as raised:
                    client.inspect("job")
                assert type(raised.value) is CLASSES[call["result"]], repr(raised.value)
                assert raised.value.code == call["code"]
            assert tried == call["tried"]


@pytest.mark.parametrize("case", TABLE["cases"], ids=lambda c: c["name"])
def test_the_asyncio_client_goes_round_the_replicas_as_the_table_says(case):
    async def main() -> None:
        tried = []
        urls = [f"http://replica-{i}" for i in range(len(case["replicas"]))]
        sync = replicas(case, tried)
        # The same replicas, behind the asyncio transport.
        transport = httpx.MockTransport(sync.handler)
        async with redlockd.AsyncClient(urls, http=httpx.AsyncClient(transport=transport)) as client:
            for call in case["calls"]:
                tried.clear()
                if call["result"] == "ok":
                    status = await client.inspect("job")
                    assert status.held and status.fencing_token == 7
                else:
                    with pytest.raises(redlockd.RedlockdError) as raised:
                        await client.inspect("job")
                    assert type(raised.value) is CLASSES[call["result"]], repr(raised.value)
                    assert raised.value.code == call["code"]
                assert tried == call["tried"]

    asyncio.run(main())
