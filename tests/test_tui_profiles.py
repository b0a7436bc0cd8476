"""The profiles screen, driven with Pilot on a dashboard fed a real boot (no host): validation as you
type, the what-if from the capacity model, the diff against the running ExecStart, saving (comments
kept, a bad TOML never written), unsaved edits kept per profile, read-only."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import Static

from console.sources.profile_store import ProfileStore, shipped_profile_dir
from console.tui.profiles import ProfileEditor, ProfileList, ProfilesScreen
from tests.tui_support import corpus_events, make_app, plain, snapshot

SIZE = (160, 48)

# Kimi K2.5 on 8x MI355X (case-01): weights loaded at f=0.826, pool 2,454,421 tokens; exact calibration.
K25 = """\
# Kimi K2.5 on the MI355X box: how far does one card go?
name = "k25-3m"
target_context = 3000000
sglang_version = "v0.5.12.post1"

[flags]
model-path = "moonshotai/Kimi-K2.5"
tp-size = 8
context-length = 3000000
mem-fraction-static = 0.83     # what the box ran with, give or take
"""

RUNNING = [
    "python3", "-m", "sglang.launch_server", "--model-path", "moonshotai/Kimi-K2.5",
    "--tp-size", "8", "--mem-fraction-static", "0.826", "--trust-remote-code",
]  # fmt: skip


@pytest.fixture
def store(tmp_path: Path) -> ProfileStore:
    user = tmp_path / "user"
    user.mkdir()
    (user / "k25-3m.toml").write_text(K25)
    shipped = shipped_profile_dir()
    assert shipped is not None
    return ProfileStore([user, shipped])


def app_with(store: ProfileStore, *, read_only: bool = False):
    app = make_app(read_only=read_only, store=store, profile="k25-3m")
    app.hosts["gpu1"].running_argv = list(RUNNING)
    return app


async def open_screen(app, pilot) -> ProfilesScreen:
    app.post_snapshot(snapshot(corpus_events("case-01"), None))
    await pilot.pause()
    await pilot.press("p")
    await pilot.pause()
    screen = app.screen
    assert isinstance(screen, ProfilesScreen)
    return screen


async def replace_line(pilot, screen: ProfilesScreen, old: str, new: str) -> None:
    """Edit as an operator does, ending with a keystroke: the line is replaced by all of `new` but its
    last character, which is typed; then the debounce delay passes."""
    editor = screen.editor
    row = editor.text.split("\n").index(old)
    editor.focus()
    editor.replace(new[:-1], (row, 0), (row, len(old)))
    editor.move_cursor((row, len(new) - 1))
    await pilot.press(new[-1])
    for _ in range(100):  # a loaded machine may fire the timer late
        await pilot.pause(0.05)
        if not screen.pending_check:
            return
    raise AssertionError("the check did not run after typing stopped")


async def test_lists_profiles_by_target_and_opens_one(store) -> None:
    app = app_with(store)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_screen(app, pilot)
        plist = screen.query_one(ProfileList)
        prompts = [plain(plist.get_option_at_index(i).prompt).strip() for i in range(plist.option_count)]
        # Grouped by target context, smallest first; the user profile sits under its own target.
        heads = [p for p in prompts if p.endswith("tokens")]
        assert heads == [
            "32,768 tokens",
            "131,072 tokens",
            "200,000 tokens",
            "262,144 tokens",
            "3,000,000 tokens",
        ]
        assert prompts[prompts.index("3,000,000 tokens") + 1].startswith("k25-3m")
        assert screen.editor.text == K25
        check = screen.check
        assert check is not None and check.ok
        w = check.whatif
        assert w is not None and w.checked and w.calibration == "exact"
        # At f=0.83 on this box the pool is ~2.47M tokens: short of 3M, so it does not fit.
        assert 2_400_000 < w.predicted_pool_tokens < 2_600_000
        assert w.fits is False
        assert "does not fit" in plain(screen.query_one("#profile-whatif", Static).content)
        # Against the running argv: the fraction changes, --trust-remote-code goes, context-length comes.
        assert "~ --mem-fraction-static 0.826 → 0.83" in check.diff
        assert "- --trust-remote-code on" in check.diff
        assert "+ --context-length 3000000" in check.diff


async def test_validation_as_you_type_names_the_flag(store) -> None:
    app = app_with(store)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_screen(app, pilot)
        await replace_line(pilot, screen, "tp-size = 8", "tp-sizes = 8")
        issues = plain(screen.query_one("#profile-issues", Static).content)
        assert "tp-sizes" in issues and "✘" in issues
        assert not screen.check.ok
        await replace_line(pilot, screen, "tp-sizes = 8", 'tp-size = "eight"')
        assert any(i.where == "flags.tp-size" for i in screen.check.errors)
        # An abbreviation that fits two flags is ambiguous, and says so.
        await replace_line(pilot, screen, 'tp-size = "eight"', "disable-cuda = true")
        ambiguous = [i for i in screen.check.errors if i.where == "flags.disable-cuda"]
        assert ambiguous and "--disable-cuda-graph-padding" in ambiguous[0].message
        # One that fits a single flag is a warning: it works, but should be written in full.
        await replace_line(pilot, screen, "disable-cuda = true", "disable-cuda-graph-pad = true")
        assert screen.check.ok
        assert [i.where for i in screen.check.issues if i.level == "warning"] == [
            "flags.disable-cuda-graph-pad"
        ]
        await replace_line(pilot, screen, "disable-cuda-graph-pad = true", "tp-size = 8")
        assert screen.check.ok and not screen.check.issues


async def test_checks_wait_for_a_pause_in_typing(store) -> None:
    app = app_with(store)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_screen(app, pilot)
        screen.check_delay_s = 2.0
        first = screen.check
        editor = screen.editor
        row = editor.text.split("\n").index("tp-size = 8")
        editor.focus()
        editor.move_cursor((row, len("tp-size")))
        await pilot.press("s", "s")
        assert "tp-sizess = 8" in editor.text
        assert screen.check is first and screen.pending_check  # not checked on each keystroke
        assert "● unsaved" in plain(screen.query_one("#profile-status", Static).content)
        for _ in range(100):
            await pilot.pause(0.05)
            if not screen.pending_check:
                break
        assert screen.check is not first and any(i.where == "flags.tp-sizess" for i in screen.check.errors)


async def test_what_if_follows_the_fraction(store) -> None:
    app = app_with(store)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_screen(app, pilot)
        before = screen.check.whatif
        assert before.headroom_gib is not None and before.headroom_gib > 3
        line = "mem-fraction-static = 0.83     # what the box ran with, give or take"
        await replace_line(pilot, screen, line, "mem-fraction-static = 0.95")
        after = screen.check.whatif
        # A bigger pool, paid for with the slack that CUDA graphs and activations need.
        assert after.predicted_pool_tokens > before.predicted_pool_tokens
        assert after.headroom_gib < 3 and after.fits is False
        assert any("headroom" in r for r in after.reasons)
        shown = plain(screen.query_one("#profile-whatif", Static).content)
        assert f"{after.predicted_pool_tokens:,} tokens" in shown and f"{after.headroom_gib:.2f} GiB" in shown


async def test_save_keeps_comments_and_refuses_a_bad_toml(store, tmp_path) -> None:
    app = app_with(store)
    path = tmp_path / "user" / "k25-3m.toml"
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_screen(app, pilot)
        await replace_line(pilot, screen, "tp-size = 8", "tp-size = 4")
        await pilot.press("ctrl+s")
        await pilot.pause()
        await pilot.press("y")  # saving asks
        await pilot.pause()
        saved = path.read_text()
        assert "tp-size = 4" in saved and "# what the box ran with, give or take" in saved
        assert saved.startswith("# Kimi K2.5 on the MI355X box")
        # A broken line: the error names the line, and the good file stays as it was.
        await replace_line(pilot, screen, "tp-size = 4", "tp-size = = 4")
        check = screen.check
        assert check.profile is None and "line 8 is not valid TOML" in check.errors[0].message
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert path.read_text() == saved
        assert "not saved" in plain(screen.query_one("#profile-status", Static).content)
        assert "tp-size = = 4" in screen.editor.text  # what was typed is still there


async def test_saving_a_shipped_profile_writes_a_user_copy(store, tmp_path) -> None:
    app = app_with(store)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_screen(app, pilot)
        screen.stash()
        screen.open_profile("ctx-200k")
        await replace_line(pilot, screen, "chunked-prefill-size = 8192", "chunked-prefill-size = 4096")
        await pilot.press("ctrl+s")
        await pilot.pause()
        await pilot.press("y")
        await pilot.pause()
        copy = tmp_path / "user" / "ctx-200k.toml"
        assert "chunked-prefill-size = 4096" in copy.read_text()
        assert "chunked-prefill-size = 8192" in (shipped_profile_dir() / "ctx-200k.toml").read_text()


async def test_unsaved_edits_survive_switching_profiles(store) -> None:
    app = app_with(store)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_screen(app, pilot)
        await replace_line(pilot, screen, "tp-size = 8", "tp-size = 2")
        plist = screen.query_one(ProfileList)
        plist.focus()
        plist.highlighted = plist.get_option_index("ctx-32k")
        await pilot.press("enter")
        await pilot.pause()
        assert screen.current == "ctx-32k" and "tp-size = 2" not in screen.editor.text
        # The list marks the edited profile.
        k25 = plain(plist.get_option_at_index(plist.get_option_index("k25-3m")).prompt)
        assert k25.startswith("●")
        plist.focus()
        plist.highlighted = plist.get_option_index("k25-3m")
        await pilot.press("enter")
        await pilot.pause()
        assert "tp-size = 2" in screen.editor.text
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, ProfilesScreen)


async def test_help_on_the_editor() -> None:
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("p")
        await pilot.pause()
        assert isinstance(app.screen.focused, ProfileList)  # picking comes first
        await pilot.press("tab")
        await pilot.pause()
        assert isinstance(app.screen.focused, ProfileEditor)
        await pilot.press("f1")
        await pilot.pause()
        assert type(app.screen).__name__ == "HelpScreen"
        assert "Profile editor" in app.screen.panel_help
        assert "ctrl+r" in app.screen.keys


async def test_read_only_refuses_apply_but_saves(store, tmp_path) -> None:
    app = app_with(store, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_screen(app, pilot)
        assert "ctrl+r" not in {k for k, b in app.active_bindings.items() if b.enabled}
        screen.action_apply()  # as if a key reached it anyway
        await pilot.pause()
        assert app.screen is screen and app.hosts["gpu1"].busy is None
        await replace_line(pilot, screen, "tp-size = 8", "tp-size = 4")
        await pilot.press("ctrl+s")
        await pilot.pause()
        await pilot.press("y")
        await pilot.pause()
        assert "tp-size = 4" in (tmp_path / "user" / "k25-3m.toml").read_text()
        # The palette offers no apply, restart or roll back.
        from console.tui.commands import ConsoleCommands

        names = [c[0] for c in ConsoleCommands(app.screen)._commands()]
        assert not any(n.startswith(("Apply", "Restart", "Roll back")) for n in names)
        assert "Profiles: edit, what-if, apply" in names


# ---- picking, editing, saving, applying: which profile is unmistakable (issue 34) ------------------


def record_applies(app) -> list[str]:
    """The profiles the screen asked the app to apply (the host's apply flow is not run)."""
    asked: list[str] = []

    async def apply(name: str) -> None:
        asked.append(name)

    app.hosts["gpu1"].apply = apply
    return asked


async def test_enter_in_the_list_keeps_the_focus_there_and_apply_names_what_was_picked(store) -> None:
    """The incident: Enter on ctx-256k, then "↑ Enter" meant to pick ctx-200k typed a blank line into
    ctx-256k, and ctrl+r saved it unasked and applied ctx-256k."""
    app = app_with(store)
    asked = record_applies(app)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_screen(app, pilot)
        plist = screen.query_one(ProfileList)
        assert app.screen.focused is plist  # picking comes first
        shipped_256k = (shipped_profile_dir() / "ctx-256k.toml").read_text()
        plist.highlighted = plist.get_option_index("ctx-256k")
        await pilot.pause()
        assert screen.current == "ctx-256k"  # the list's cursor is the profile shown
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen.focused is plist
        await pilot.press("up", "enter")
        await pilot.pause()
        assert screen.current == "ctx-200k"
        assert screen.editor.text == (shipped_profile_dir() / "ctx-200k.toml").read_text()
        assert screen.buffers.get("ctx-256k") is None  # nothing typed into ctx-256k
        assert "profile ctx-200k" in plain(screen.query_one("#profiles-title", Static).content)
        await pilot.press("ctrl+r")
        for _ in range(40):
            await pilot.pause(0.05)
            if asked:
                break
        assert asked == ["ctx-200k"]
        assert not (screen.store.dirs[0] / "ctx-256k.toml").exists()
        assert (shipped_profile_dir() / "ctx-256k.toml").read_text() == shipped_256k


async def test_saving_an_edit_asks_and_shows_it(store, tmp_path) -> None:
    app = app_with(store)
    path = tmp_path / "user" / "k25-3m.toml"
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_screen(app, pilot)
        # A stray Enter in the editor: a blank line, which changes no flag.
        editor = screen.editor
        editor.focus()
        editor.move_cursor((2, 0))
        await pilot.press("enter")
        await pilot.pause()
        await pilot.press("ctrl+s")
        await pilot.pause()
        dialog = app.screen
        assert type(dialog).__name__ == "SaveConfirmScreen"
        shown = plain(dialog.query_one("#confirm-question", Static).content) + plain(
            dialog.query_one("#save-edit", Static).content
        )
        assert "Save k25-3m?" in shown and str(path) in shown
        assert "line 3: + (blank line)" in shown and "the profile itself does not change" in shown
        await pilot.press("n")
        await pilot.pause()
        assert app.screen is screen and path.read_text() == K25  # not written
        await replace_line(pilot, screen, "tp-size = 8", "tp-size = 4")
        await pilot.press("ctrl+s")
        await pilot.pause()
        shown = plain(app.screen.query_one("#save-edit", Static).content)
        assert "- tp-size = 8" in shown and "+ tp-size = 4" in shown
        assert "does not change" not in shown
        await pilot.press("y")
        await pilot.pause()
        assert app.screen is screen and "tp-size = 4" in path.read_text()


async def test_apply_with_unsaved_edits_asks_to_save_first(store, tmp_path) -> None:
    app = app_with(store)
    asked = record_applies(app)
    path = tmp_path / "user" / "k25-3m.toml"
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_screen(app, pilot)
        await replace_line(pilot, screen, "tp-size = 8", "tp-size = 4")
        await pilot.press("ctrl+r")
        await pilot.pause()
        dialog = app.screen
        assert type(dialog).__name__ == "SaveConfirmScreen"
        question = plain(dialog.query_one("#confirm-question", Static).content)
        assert "Save the edits to k25-3m, then apply k25-3m to gpu1?" in question
        await pilot.press("n")
        await pilot.pause()
        assert asked == [] and path.read_text() == K25
        await pilot.press("ctrl+r")
        await pilot.pause()
        await pilot.press("y")
        for _ in range(40):
            await pilot.pause(0.05)
            if asked:
                break
        assert asked == ["k25-3m"] and "tp-size = 4" in path.read_text()
