"""diagnose on run dirs written by the real transformers.Trainer: a healthy one stays clean, a faulty one is caught."""

from __future__ import annotations

from gradian.diagnose.runner import diagnose

PLANTED = {
    # data faults planted in faulty.jsonl
    "schema_invalid", "no_assistant_turn", "empty_assistant_turn", "exact_duplicates", "near_duplicates",
    "conflicting_answers", "foreign_template_markup",
    # config faults planted in the Trainer arguments and the LoRA config
    "lr_too_high_for_lora", "attention_only_targets", "alpha_rank_extreme", "warmup_dominates",
    "grad_clip_disabled", "too_many_epochs", "no_eval_split",
    # stopped by a callback at step 30 of 108
    "run_incomplete",
}


def test_healthy_real_run_has_no_warnings_or_errors(real_runs):
    report = diagnose(dataset=real_runs.healthy_dataset, run=real_runs.healthy_run, base_model=str(real_runs.base_dir),
                      eval_dataset=real_runs.eval_dataset)
    assert not report.skipped and not report.failed
    assert len(report.ran) == 44
    assert [f"{f.check_id}: {f.message}" for f in report.findings if f.severity in ("error", "warning")] == []
    assert report.inputs["run"]["reader"] == "hf-trainer"
    assert report.inputs["adapter"]["found_in_run_dir"] is True


def test_faulty_real_run_reports_every_planted_fault(real_runs):
    report = diagnose(dataset=real_runs.faulty_dataset, run=real_runs.faulty_run, base_model=str(real_runs.base_dir))
    found = {f.check_id for f in report.findings}
    assert PLANTED <= found, PLANTED - found
    by_id = {f.check_id: f for f in report.findings}
    assert by_id["lr_too_high_for_lora"].severity == "error"
    assert by_id["lr_too_high_for_lora"].evidence[0].location.endswith("training_args.bin")
    assert by_id["run_incomplete"].evidence[0].steps == (30,)
    bad_rows = {e.location.rsplit(":", 1)[1] for e in by_id["schema_invalid"].evidence}
    assert bad_rows == {"37", "38"}  # the broken JSON line and the unknown role


def test_without_run_only_data_checks_run_and_the_rest_say_what_they_need(real_runs):
    report = diagnose(dataset=real_runs.healthy_dataset)
    families = {report.checks[cid].family for cid in report.ran}
    assert families == {"data"}
    skipped = {s.id: s for s in report.skipped}
    assert "lr_too_high_for_lora" in skipped and "--run" in skipped["lr_too_high_for_lora"].reason()
    assert "--base-model" in skipped["truncated_answers"].reason()
    assert "--eval-dataset" in skipped["train_eval_overlap"].reason()
    assert "--adapter" in skipped["adapter_untrained"].reason()


def test_a_finished_run_without_save_state_is_not_reported_incomplete(real_runs, tmp_path):
    """Most scripts call save_model() but never save_state(): the state is only in checkpoint-N/."""
    import shutil

    run = shutil.copytree(real_runs.healthy_run, tmp_path / "run")
    (run / "trainer_state.json").unlink()
    report = diagnose(run=run, select=("run_incomplete",))
    assert report.ran == ("run_incomplete",) and report.findings == ()
    assert report.inputs["run"]["trainer_state"] == str(run / "checkpoint-42" / "trainer_state.json")


def test_a_stopped_run_without_save_state_names_the_checkpoint_it_read(real_runs, tmp_path):
    import shutil

    run = shutil.copytree(real_runs.faulty_run, tmp_path / "run")
    (run / "trainer_state.json").unlink()
    (finding,) = diagnose(run=run, select=("run_incomplete",)).findings
    assert finding.message.startswith("the run stopped at step 30 of 108")
    assert "checkpoint-30/trainer_state.json" in finding.message
    assert finding.evidence[0].location.startswith(str(run / "checkpoint-30" / "trainer_state.json"))
