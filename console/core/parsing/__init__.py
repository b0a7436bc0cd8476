"""The journal parser's parts: the line envelope (`envelope`, `journal_json`), SGLang's messages
(`messages`, `server_args`, `units`, `errors`), and event building (`build`). `console.core.parser`
puts them together as the streaming `JournalParser`."""
