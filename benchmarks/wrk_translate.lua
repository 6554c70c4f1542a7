-- wrk script: POST one sentence per request to attnmt serve's /v1/translate.
-- Usage: wrk -t2 -c200 -d60s -s benchmarks/wrk_translate.lua URL -- BODIES
-- BODIES: a file of JSON request bodies, one a line ({"text": "..."}); each wrk thread cycles
-- through them from its own offset. done() prints one JSON line: requests, non-2xx responses,
-- seconds, and the latency percentiles in milliseconds.

local bodies, index, threads = {}, 1, {}

function setup(thread)
  thread:set("id", #threads)
  table.insert(threads, thread)
end

function init(args)
  for line in io.lines(args[1]) do
    table.insert(bodies, line)
  end
  index = (id * 97) % #bodies + 1
  wrk.method = "POST"
  wrk.path = "/v1/translate"
  wrk.headers["Content-Type"] = "application/json"
end

function request()
  local body = bodies[index]
  index = index % #bodies + 1
  return wrk.format(nil, nil, nil, body)
end

function done(summary, latency, requests)
  local errors = summary.errors.status + summary.errors.connect + summary.errors.read
                 + summary.errors.write + summary.errors.timeout
  io.write(string.format(
    '{"requests": %d, "errors": %d, "non_2xx": %d, "seconds": %.3f, "p50_ms": %.1f, "p90_ms": %.1f, ' ..
    '"p99_ms": %.1f, "max_ms": %.1f}\n',
    summary.requests, errors, summary.errors.status, summary.duration / 1e6,
    latency:percentile(50) / 1e3, latency:percentile(90) / 1e3, latency:percentile(99) / 1e3, latency.max / 1e3))
end
