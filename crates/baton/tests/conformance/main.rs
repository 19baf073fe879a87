//! The conformance suite: one set of tests, run against every backend.
//!
//! Each test is an `async fn(TestStore)` in one of the modules below; the
//! test kit's `per_backend!` instantiates it once per backend, as
//! `sqlite::NAME`, `postgres::NAME`, `redis::NAME` and `mysql::NAME`. Run one backend with
//! `cargo test -p baton --test conformance -- sqlite::`.
//!
//! A backend is done when this suite passes on it. Adding a backend is one
//! file in `src/store/` and one line in the test kit's `per_backend!`.
//!
//! Backends find their servers through `BATON_TEST_POSTGRES` (default
//! `postgres://postgres@127.0.0.1:5432/test`), `BATON_TEST_REDIS`
//! (default `redis://127.0.0.1:6379`) and `BATON_TEST_MYSQL` (default
//! `mysql://root@127.0.0.1:3306/test`, MySQL 8+ or MariaDB 10.6+). A server that does not answer makes
//! its tests print one `SKIPPED` line and pass, unless
//! `BATON_REQUIRE_BACKENDS=1`, which makes them fail.

mod audit;
mod debounce;
mod delete;
mod fair;
mod identity;
mod idle;
mod jobdefs;
mod key_rate;
mod keys;
mod lock_history;
mod locks;
mod model;
mod overlap;
mod pause_notes;
mod queue;
mod queue_view;
mod rate;
mod rollup;
mod schedule;
mod search;
mod snooze;
mod states;
mod timing;
mod typed;
mod unique;
mod upgrade;

pub use baton_testkit::harness;
pub use harness::TestStore;

baton_testkit::per_backend! {
    run: crate::harness::run, threads: 4;
    idle::idle_worker_makes_about_one_query_per_second,
    idle::busy_worker_sends_its_results_with_its_claims,
    identity::a_store_that_forgot_is_noticed,
    identity::task_ids_never_repeat_after_a_restore,
    jobdefs::definitions_are_versioned_compare_and_set,
    jobdefs::stored_jobs_follow_changes_once_per_slot,
    jobdefs::registration_keeps_the_definition_fingerprint,
    jobdefs::a_definitions_write_is_heard_at_once,
    jobdefs::old_tombstones_are_pruned_keeping_the_revision,
    jobdefs::a_stale_definition_cannot_take_a_newer_ones_slot,
    locks::grant_busy_release,
    locks::tokens_strictly_increase,
    locks::mutual_exclusion_16_contenders,
    locks::lapsed_holder_cannot_extend_or_release,
    locks::at_least_is_honoured,
    locks::at_most_lapses_a_dropped_lease,
    locks::keep_alive_extends_and_signals_loss,
    locks::wait_gets_the_lock_when_released,
    locks::client_clock_skew_changes_nothing,
    locks::list_and_get,
    locks::bad_input_is_refused,
    locks::tokens_rise_after_the_record_is_lost,
    locks::names_are_exact,
    locks::revoke_refuses_the_holder_and_frees_within_the_bound,
    locks::holder_learns_of_a_revocation_within_the_confirm_period,
    delete::delete_takes_what_is_not_running,
    delete::a_deleted_slot_is_never_run_again,
    states::every_transition_matches_the_table,
    states::every_birth_matches_the_table,
    snooze::snoozed_task_is_pending_later_and_uncounted,
    snooze::handler_snooze_cancel_and_retry_delays,
    queue::claim_order_priority_run_at_id,
    queue::claim_buffer_share_skips_last_attempts,
    queue::claim_buffer_share_takes_the_first_in_order,
    queue::unique_key_race_gives_one_task,
    queue::batch_enqueue_is_idempotent_per_key,
    queue::payload_limit_is_enforced,
    queue::traceparent_round_trips,
    queue::claim_answers_every_field_as_stored,
    queue::finish_is_compare_and_set,
    queue::finish_many_is_per_item_compare_and_set,
    queue::finish_many_of_successes_refuses_only_the_stale,
    queue::finish_and_claim_is_per_item_compare_and_set,
    queue::rescue_out_of_attempts_fails_with_reason,
    queue::retries_with_backoff_then_succeeds,
    queue::out_of_attempts_is_dead_lettered_and_retryable,
    queue::cancel_pending_and_running,
    queue::shutdown_hands_back_without_burning_an_attempt,
    queue::shutdown_lets_short_handlers_finish,
    queue::heartbeats_keep_a_long_task_alive,
    queue::timeout_fails_the_attempt,
    queue::panicking_and_stuck_handlers_fail_and_are_dropped,
    queue::wake_up_without_waiting_for_a_poll,
    queue::a_wake_up_sent_right_after_subscribing_is_heard,
    queue::many_tasks_four_workers_all_succeed,
    queue::pipelined_workers_run_each_task_once,
    queue::prefetched_tasks_heartbeated_handed_back_run_once,
    queue::prefetch_never_holds_a_last_attempt,
    queue::inspect_list_stats_prune,
    search::search_by_kind_key_text_and_time,
    audit::audit_records_list_page_and_prune,
    rollup::rollup_flushes_add_up_read_by_range_and_prune,
    lock_history::releases_are_kept_listed_and_pruned,
    search::bad_search_terms_are_refused_by_name,
    queue::worker_counters_count_outcomes,
    queue::max_running_caps_the_whole_cluster,
    keys::per_key_cap_holds_under_16_racing_claimers,
    keys::wide_per_key_cap_holds_under_16_racing_claimers,
    keys::claims_of_every_kind_keep_one_per_key_cap,
    keys::key_capped_buffer_only_where_places_spare,
    keys::key_capped_worker_prefetches_where_places_spare,
    keys::saturated_key_does_not_hold_back_other_keys,
    keys::workers_run_one_per_key_and_start_the_next_at_once,
    queue_view::key_load_counts_running_and_pending_per_key,
    queue_view::declared_limits_are_kept_and_listed,
    fair::backlog_of_one_key_does_not_hold_back_the_others,
    fair::fair_claim_keeps_priority_first,
    fair::fair_claims_keep_the_per_key_cap_under_16_racing_claimers,
    fair::fair_workers_run_a_small_key_past_a_backlog,
    fair::fair_claims_see_the_tasks_enqueued_before_the_fair_upgrade,
    fair::fair_claims_see_every_due_task,
    fair::fair_claims_serve_the_fewest_running_first,
    fair::fair_claims_keep_the_rate_limit_and_max_running,
    rate::rate_limit_holds_in_every_window_under_racing_claimers,
    rate::shared_rate_limit_holds_across_two_queues,
    rate::workers_wait_for_the_next_allowed_start,
    rate::rated_claims_answer_each_finish_they_carry,
    key_rate::key_rate_holds_in_every_window_under_16_racing_claimers,
    key_rate::limited_key_does_not_hold_back_others_and_says_when,
    key_rate::key_view_shows_each_keys_rate_state,
    key_rate::buffered_start_is_logged_at_its_holds_end,
    key_rate::buffered_task_starts_within_its_hold_or_goes_back,
    key_rate::key_logs_survive_the_array_upgrade,
    key_rate::key_log_keeps_one_period,
    key_rate::rated_claims_carry_finishes,
    queue::stale_claim_after_hand_back_is_refused,
    queue::resent_finish_many_changes_nothing,
    queue::cancel_requested_then_retryable_failure_cancels,
    queue::cancel_requested_then_hand_back_cancels,
    queue::claim_tokens_rise_across_hand_back_rescue_and_retry,
    queue::run_at_and_retry_onto_a_taken_key,
    queue::paused_queue_gives_no_claims_while_others_do,
    queue::resume_makes_tasks_claimable_and_wakes_workers,
    queue::pause_leaves_running_tasks_alone,
    schedule::cursor_is_compare_and_set,
    schedule::overlap_forbid_records_a_skip,
    overlap::buffer_one_waits_for_the_running_run_and_keeps_one,
    overlap::buffer_all_runs_each_waiting_slot_in_order,
    overlap::cancel_other_stops_the_previous_and_waits_for_it,
    overlap::terminate_other_is_decided_as_cancel_other,
    overlap::racing_releases_start_a_waiting_slot_once,
    overlap::a_worker_releases_only_for_jobs_that_may_wait,
    overlap::schedulers_poll_releases_only_for_waiting_policies,
    overlap::a_workers_sweep_starts_a_slot_no_one_released,
    pause_notes::job_records_its_policy_and_pause_notes,
    pause_notes::queue_pause_notes_are_kept_and_shown,
    schedule::trigger_and_scheduler_share_a_slot,
    schedule::five_schedulers_run_each_slot_once,
    schedule::catch_up_all_runs_every_missed_slot_once,
    schedule::catch_up_latest_runs_one_missed_slot,
    schedule::a_running_scheduler_follows_the_store_clock,
    schedule::lock_mode_runs_each_slot_on_one_instance,
    schedule::advance_is_checked_against_store_time,
    schedule::run_and_skip_records,
    schedule::run_record_leaves_an_existing_slot_task_alone,
    schedule::catch_up_batch_is_not_its_own_previous_run,
    schedule::task_created_after_the_slot_is_not_its_previous_run,
    schedule::scheduler_joining_a_catch_up_runs_its_last_slot,
    schedule::lock_mode_without_at_least_runs_each_slot_once,
    schedule::catch_up_all_with_overlap_forbid,
    schedule::fixed_delay_counts_from_the_previous_end,
    schedule::on_time_slot_is_taken_within_its_lead,
    schedule::early_take_is_judged_by_the_store,
    schedule::a_pruned_slot_is_never_run_again,
    upgrade::v1_store_upgrades_in_place,
    upgrade::schema_status_reports_the_recorded_version,
    upgrade::remove_schema_leaves_nothing_of_the_prefix,
    upgrade::concurrent_first_connects_migrate_once,
    upgrade::unique_keys_are_rescoped_on_upgrade,
    unique::scopes_compare_what_they_name,
    debounce::debounce_racing_enqueuers_leave_one_pending_task,
    debounce::debounce_pushes_the_due_time_to_the_last_change,
    debounce::debounce_leaves_a_running_task_alone,
    debounce::throttle_refuses_within_the_period,
    debounce::throttle_accepts_once_after_the_period,
    debounce::debounce_and_throttle_bad_input_is_refused,
    debounce::typed_kind_debounces_its_key,
    unique::by_args_dedupes_equal_payloads_in_any_order,
    unique::period_keys_differ_across_buckets,
    unique::retry_refuses_a_taken_scoped_key,
    unique::until_failed_holds_through_success_only,
    upgrade::unique_holds_survive_the_hold_upgrade,
    model::store_agrees_with_the_model,
    timing::delayed_task_starts_at_its_run_at,
    timing::retry_written_elsewhere_starts_when_its_backoff_ends,
    timing::own_retry_starts_when_its_backoff_ends,
    typed::typed_tasks_decode_or_fail_permanently,
}
