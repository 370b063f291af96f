"""Every limit on the size of a text or a count, by name, in one place: how much of a thing is
sent, shown, kept or read, and how characters stand for tokens.

It imports nothing of agent-demo's.
"""

CONNECT_SECONDS = 10.0  # the longest wait for a connection (less when --timeout is shorter)

# Characters for a token: a request is measured against the model's window counting few (at most
# 3: it must fit), tokens spent are estimated counting more (4: no reply gives back its budget).
CHARS_A_TOKEN = 3
ESTIMATED_CHARS_A_TOKEN = 4


DEFAULT_WINDOW_TOKENS = 128_000  # the window of a model whose server does not say: today's hosted models
UNSAID_LOCAL_WINDOW_TOKENS = 8_192  # a local server that does not say its window: llama.cpp-python's, say


PINNED_SHARE = 0.75  # the system prompt, the task and its material take at most this share of a request


TASK_SHOWN_CHARS = 300  # the task (or a follow-up) on the trace's first lines


MESSAGE_CHARS = 300  # outside words quoted in a one-line error (a server's message, a schema's complaint)


SNIPPET_CHARS = 200  # the start of a body or an error that is quoted as a sample


VALUE_SHOWN_CHARS = 60  # a value, a tool's name or a command named inside a message


ARGS_LABEL_CHARS = 200  # a call's arguments, as the label of its result


DIGEST_ARGS_CHARS = 120  # a folded call's arguments in the digest


DIGEST_RESULT_WIDTHS = (400, 100)  # a folded result once the digest runs short of room, then shorter


NOTES_CHARS = 2_000  # what the notes may take in a request (less when --max-context leaves little room)


MATERIAL_SHOWN_CHARS = 1_500  # large piped material shown with the task (on the wire)


PAGE_MARGIN_CHARS = 200  # a page of material is this much smaller than a result may be


MIN_PAGE_CHARS = 200  # a page of material never shrinks below this to fit its escapes


PAGE_STEP_CHARS = 50  # ... and shrinks by at least this much more than its escapes took


MIN_RESULT_CHARS = PAGE_MARGIN_CHARS + MIN_PAGE_CHARS  # AGENT_MAX_RESULT_CHARS at least: a page must fit


RESULT_MARKER_CHARS = 100  # what a cut result's marker and its two new fields take


RECALL_NOTE_CHARS = 150  # what recall's note about rounds that did not fit takes


EXPRESSION_CHARS = 200  # the calculator's expression at most


FUNCTION_NAME_CHARS = 64  # a tool's name, as endpoints take a function name


MAX_PARSED_CHARS = 100_000  # a longer reply is read at its beginning and at its end


# A streamed reply is cut past this many characters for each token of its cap (--max-reply-tokens,
# or the model's window when there is none), counted as a cap of at least MIN_LIMIT_TOKENS (a
# reasoning model's thinking may not count against the cap): a token is 3-4 characters, rarely 16.
REPLY_CHARS_A_TOKEN = 16


MIN_LIMIT_TOKENS = 65_536


REPLY_BYTES_A_CHAR = 8  # a plain (not streamed) body of more bytes than this a character is not read


SERVER_TEXT_SCANNED = 20_000  # of an error body, what is searched for the server's words


CHECK_OUTPUT_CHARS = 100_000  # of the check's output, kept in the trace


CHECK_OUTPUT_SHOWN = 4_000  # of the check's last output, shown when it ended the run


CHECK_OUTPUT_LINES = 40  # ... in at most this many lines


LAST_WORDS_CHARS = 500  # the model's last words (or last answer), shown when a run ends without an answer


LAST_WORDS_LINES = 5


CHECK_VARIABLE_CHARS = 100_000  # AGENT_ANSWER and AGENT_TASK (stdin always has the whole answer)


CHECK_LINE_CHARS = 200  # the start of the check's output on its trace line


THOUGHT_SHOWN_CHARS = 80  # the first line of a thought on the trace


STATUS_KEPT_CHARS = 2_000  # of a reply streaming in, what the status line keeps


STATUS_SHOWN_CHARS = 600  # ... and looks at for the words that fit the terminal


MOST_ABSORBED = 30  # 429s in a row a batch's request waits out (in its request gate) before they count as retries
