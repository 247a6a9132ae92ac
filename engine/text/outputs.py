"""What a caller sees of each request: the incremental detokenizer of every live request with
a tokenizer, and the RequestOutput of a step (new text, stop strings applied)."""

from __future__ import annotations

from collections.abc import Callable

from engine.scheduling.request import Request, RequestOutput, RequestStatus
from engine.text.detokenizer import IncrementalDetokenizer


class Outputs:
    """Owned by the engine thread: one IncrementalDetokenizer per live request."""

    def __init__(self, tokenizer, stop: Callable[[Request], None]) -> None:
        """tokenizer: None for a token-ids-only model (outputs carry no text). stop(req):
        finishes a request whose text matched a stop string (the scheduler frees it)."""
        self.tokenizer = tokenizer
        self.stop = stop
        self._detokenizers: dict[str, IncrementalDetokenizer] = {}

    def start(self, req: Request) -> None:
        if self.tokenizer is not None:
            params = req.params
            self._detokenizers[req.request_id] = IncrementalDetokenizer(
                self.tokenizer, req.prompt_token_ids, params.skip_special_tokens, params.stop
            )

    def output(self, req: Request) -> RequestOutput:
        """req's output now (its detokenizer dropped once it finished)."""
        detok = self._detokenizers.get(req.request_id)
        if detok is not None and req.status is not RequestStatus.FINISHED_ABORTED:
            self._detokenize(req, detok)
        finished = req.is_finished
        if finished:
            self._detokenizers.pop(req.request_id, None)
        return RequestOutput(
            request_id=req.request_id,
            prompt_token_ids=req.prompt_token_ids,
            token_ids=req.output_token_ids,
            text=detok.text if detok is not None else "",
            finished=finished,
            finish_reason=req.status.value if finished else None,
            metrics=req.metrics.snapshot(),  # readers on other threads
            logprobs=list(req.logprobs) if req.logprobs is not None else None,
            stop_reason=req.stop_reason,
            trace=list(req.trace) if finished else [],
            pooled=req.pooled,
        )

    def _detokenize(self, req: Request, detok: IncrementalDetokenizer) -> None:
        """Feed the new tokens to the detokenizer, one at a time; a matched stop string
        finishes the request, dropping the tokens a speculative step emitted after it."""
        if detok.stopped_on is not None:
            return
        # only the new ids (output_token_ids would copy the whole output every step)
        start = req.num_prompt_tokens + len(detok.token_ids)
        detok.step_each(req.token_ids[start : len(req.token_ids) - req.num_pending])
        if detok.stopped_on is not None:
            req.stop_reason = detok.stopped_on
            req.truncate_output(len(detok.token_ids))
            self.stop(req)
        elif req.is_finished:
            detok.finish()
