// searchScore against Python's SearchOptions.score on the same hypotheses: the cases (options,
// log P, length and Python's score) come from the JSON file named by ATTNMT_SCORE_CASES, which
// tests/test_web_scores.py writes; without it this test is skipped.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import { searchScore } from "../src/search.js";

const file = process.env.ATTNMT_SCORE_CASES;

test("searchScore equals SearchOptions.score", { skip: !file && "ATTNMT_SCORE_CASES is not set" }, () => {
  const cases = JSON.parse(readFileSync(file, "utf-8"));
  assert.ok(cases.length > 0);
  for (const { options, logProb, length, score } of cases) {
    const got = searchScore(logProb, length, options);
    assert.ok(Math.abs(got - score) <= 1e-12 * Math.max(1, Math.abs(score)),
              `${JSON.stringify(options)} log P ${logProb} length ${length}: JS ${got}, Python ${score}`);
  }
});
