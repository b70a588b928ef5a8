--
-- PostgreSQL database dump
--

\restrict 6mDZ8PnZRl0Z5vqfMrfRzB47pALRmzAdJK8AaRc9SJIZAUlZNCwHBvVCfXPJdiA

-- Dumped from database version 15.18 (Debian 15.18-0+deb12u1)
-- Dumped by pg_dump version 15.18 (Debian 15.18-0+deb12u1)

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: gpushare_grant_use; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.gpushare_grant_use (
    grant_id character varying(64) NOT NULL,
    gpu_uuid character varying(255) NOT NULL,
    month character varying(7) NOT NULL,
    samples integer NOT NULL,
    utilization_pct_sum double precision NOT NULL,
    memory_used_mib_sum double precision NOT NULL,
    last_ts double precision NOT NULL
);


--
-- Name: gpushare_grants; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.gpushare_grants (
    id character varying(64) NOT NULL,
    request_id character varying(64) NOT NULL,
    username character varying(255) NOT NULL,
    server character varying(255) NOT NULL,
    team character varying(255) NOT NULL,
    pool character varying(255) NOT NULL,
    profile character varying(255) NOT NULL,
    kind character varying(16) NOT NULL,
    node character varying(255) NOT NULL,
    slices json NOT NULL,
    units_milli integer NOT NULL,
    borrowed boolean NOT NULL,
    preemptible boolean NOT NULL,
    priority character varying(255) NOT NULL,
    priority_value integer NOT NULL,
    grace_period_s integer NOT NULL,
    spec json NOT NULL,
    granted_at double precision NOT NULL,
    released_at double precision,
    release_reason text,
    preempt_for character varying(64),
    preempt_reason text,
    preempt_deadline double precision
);


--
-- Name: gpushare_heartbeats; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.gpushare_heartbeats (
    id integer NOT NULL,
    grant_id character varying(64) NOT NULL,
    ts double precision NOT NULL,
    simulated boolean NOT NULL,
    gpus json NOT NULL
);


--
-- Name: gpushare_heartbeats_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.gpushare_heartbeats_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: gpushare_heartbeats_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.gpushare_heartbeats_id_seq OWNED BY public.gpushare_heartbeats.id;


--
-- Name: gpushare_job_events; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.gpushare_job_events (
    id integer NOT NULL,
    job_id character varying(64) NOT NULL,
    ts double precision NOT NULL,
    from_state character varying(16),
    to_state character varying(16) NOT NULL,
    attempt integer NOT NULL,
    reason text NOT NULL
);


--
-- Name: gpushare_job_events_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.gpushare_job_events_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: gpushare_job_events_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.gpushare_job_events_id_seq OWNED BY public.gpushare_job_events.id;


--
-- Name: gpushare_job_notebooks; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.gpushare_job_notebooks (
    job_id character varying(64) NOT NULL,
    notebook text NOT NULL,
    size integer NOT NULL
);


--
-- Name: gpushare_jobs; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.gpushare_jobs (
    id character varying(64) NOT NULL,
    username character varying(255) NOT NULL,
    team character varying(255) NOT NULL,
    server character varying(255) NOT NULL,
    name character varying(255) NOT NULL,
    path text NOT NULL,
    profile character varying(255) NOT NULL,
    pool character varying(255) NOT NULL,
    priority character varying(255) NOT NULL,
    request_spec json NOT NULL,
    parameters json NOT NULL,
    max_runtime_s integer NOT NULL,
    checkpoint boolean NOT NULL,
    backend character varying(64) NOT NULL,
    output_path text NOT NULL,
    state character varying(16) NOT NULL,
    reason text NOT NULL,
    attempt integer NOT NULL,
    request_id character varying(64),
    grant_id character varying(64),
    handle json,
    error json,
    gpu_hours double precision NOT NULL,
    preempt_signalled boolean NOT NULL,
    cancel_requested boolean NOT NULL,
    created_at double precision NOT NULL,
    updated_at double precision NOT NULL,
    started_at double precision,
    ended_at double precision
);


--
-- Name: gpushare_node_power; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.gpushare_node_power (
    node character varying(255) NOT NULL,
    hour_start double precision NOT NULL,
    samples integer NOT NULL,
    watts_sum double precision NOT NULL,
    watts_max double precision NOT NULL
);


--
-- Name: gpushare_nodes; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.gpushare_nodes (
    name character varying(255) NOT NULL,
    cordoned boolean NOT NULL,
    updated_at double precision NOT NULL,
    broker_drain text
);


--
-- Name: gpushare_requests; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.gpushare_requests (
    id character varying(64) NOT NULL,
    username character varying(255) NOT NULL,
    server character varying(255) NOT NULL,
    team character varying(255) NOT NULL,
    pool character varying(255) NOT NULL,
    kind character varying(16) NOT NULL,
    profile character varying(255) NOT NULL,
    status character varying(16) NOT NULL,
    reason text NOT NULL,
    code character varying(64) NOT NULL,
    spec json NOT NULL,
    grant_id character varying(64),
    idempotency_key character varying(255),
    created_at double precision NOT NULL,
    updated_at double precision NOT NULL
);


--
-- Name: gpushare_schema; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.gpushare_schema (
    id integer NOT NULL,
    version integer NOT NULL
);


--
-- Name: gpushare_schema_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.gpushare_schema_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: gpushare_schema_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.gpushare_schema_id_seq OWNED BY public.gpushare_schema.id;


--
-- Name: gpushare_usage_month; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.gpushare_usage_month (
    team character varying(255) NOT NULL,
    pool character varying(255) NOT NULL,
    month character varying(7) NOT NULL,
    samples integer NOT NULL,
    utilization_pct_sum double precision NOT NULL,
    memory_used_mib_sum double precision NOT NULL,
    last_ts double precision NOT NULL
);


--
-- Name: gpushare_heartbeats id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.gpushare_heartbeats ALTER COLUMN id SET DEFAULT nextval('public.gpushare_heartbeats_id_seq'::regclass);


--
-- Name: gpushare_job_events id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.gpushare_job_events ALTER COLUMN id SET DEFAULT nextval('public.gpushare_job_events_id_seq'::regclass);


--
-- Name: gpushare_schema id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.gpushare_schema ALTER COLUMN id SET DEFAULT nextval('public.gpushare_schema_id_seq'::regclass);


--
-- Data for Name: gpushare_grant_use; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.gpushare_grant_use VALUES ('g0', 'GPU-0', '2026-05', 3, 123, 3072, 1780000020);


--
-- Data for Name: gpushare_grants; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.gpushare_grants VALUES ('g0', 'r0', 'alice', '', 'a', 'train', '', 'interactive', 'train-n0', '[{"gpu": "GPU-0", "milli": 1000}]', 1000, false, true, 'research', 100, 30, '{"pool": "train", "gpus": 1, "kind": "interactive"}', 1780000000, NULL, NULL, NULL, NULL, NULL);
INSERT INTO public.gpushare_grants VALUES ('g1', 'r1', 'bob', '', 'b', 'train', '', 'interactive', 'train-n0', '[{"gpu": "GPU-0", "milli": 1000}]', 1000, false, true, 'research', 100, 30, '{"pool": "train", "gpus": 1, "kind": "interactive"}', 1780000001, 1780000100, 'preempted: team a reclaims', 'r0', 'team a reclaims', 1780000090);
INSERT INTO public.gpushare_grants VALUES ('g2', 'r2', 'carol', '', 'b', 'train', '', 'interactive', 'train-n0', '[{"gpu": "GPU-0", "milli": 1000}]', 1000, false, true, 'research', 100, 30, '{"pool": "train", "gpus": 1, "kind": "interactive"}', 1780000002, 1780000200, 'culled: idle 2 h', NULL, NULL, NULL);


--
-- Data for Name: gpushare_heartbeats; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.gpushare_heartbeats VALUES (1, 'g0', 1780000000, true, '[{"uuid": "GPU-0", "utilization_pct": 40, "memory_used_mib": 1024}]');
INSERT INTO public.gpushare_heartbeats VALUES (2, 'g0', 1780000010, true, '[{"uuid": "GPU-0", "utilization_pct": 41, "memory_used_mib": 1024}]');
INSERT INTO public.gpushare_heartbeats VALUES (3, 'g0', 1780000020, true, '[{"uuid": "GPU-0", "utilization_pct": 42, "memory_used_mib": 1024}]');


--
-- Data for Name: gpushare_job_events; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.gpushare_job_events VALUES (1, 'j0', 1780000000, NULL, 'queued', 1, 'submitted');
INSERT INTO public.gpushare_job_events VALUES (2, 'j0', 1780000900, 'running', 'succeeded', 1, '');


--
-- Data for Name: gpushare_job_notebooks; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.gpushare_job_notebooks VALUES ('j0', '{"cells": [], "nbformat": 4}', 29);


--
-- Data for Name: gpushare_jobs; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.gpushare_jobs VALUES ('j0', 'alice', 'a', '', 'train.ipynb', 'work/train.ipynb', '', 'train', 'research', '{"pool": "train", "gpus": 1, "kind": "interactive"}', '{"epochs": 2}', 3600, false, 'local', '/tmp/out/j0.ipynb', 'succeeded', '', 1, 'r0', 'g0', '{"pid": 4242}', 'null', 0.25, false, false, 1780000000, 1780000900, 1780000005, 1780000900);


--
-- Data for Name: gpushare_node_power; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.gpushare_node_power VALUES ('train-n0', 1779998400, 3, 900, 310.5);


--
-- Data for Name: gpushare_nodes; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.gpushare_nodes VALUES ('train-n0', false, 1780000000, NULL);
INSERT INTO public.gpushare_nodes VALUES ('train-n1', true, 1780000005, NULL);


--
-- Data for Name: gpushare_requests; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.gpushare_requests VALUES ('r0', 'alice', '', 'a', 'train', 'interactive', '', 'granted', '', '', '{"pool": "train", "gpus": 1, "kind": "interactive"}', 'g0', 'k0', 1780000000, 1780000000);
INSERT INTO public.gpushare_requests VALUES ('r1', 'bob', '', 'b', 'train', 'interactive', '', 'released', '', '', '{"pool": "train", "gpus": 1, "kind": "interactive"}', 'g1', 'k1', 1780000001, 1780000001);
INSERT INTO public.gpushare_requests VALUES ('r2', 'carol', '', 'b', 'train', 'interactive', '', 'released', '', '', '{"pool": "train", "gpus": 1, "kind": "interactive"}', 'g2', 'k2', 1780000002, 1780000002);


--
-- Data for Name: gpushare_schema; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.gpushare_schema VALUES (1, 5);


--
-- Data for Name: gpushare_usage_month; Type: TABLE DATA; Schema: public; Owner: -
--

INSERT INTO public.gpushare_usage_month VALUES ('a', 'train', '2026-05', 3, 123, 3072, 1780000020);


--
-- Name: gpushare_heartbeats_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.gpushare_heartbeats_id_seq', 1, false);


--
-- Name: gpushare_job_events_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.gpushare_job_events_id_seq', 1, false);


--
-- Name: gpushare_schema_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.gpushare_schema_id_seq', 1, false);


--
-- Name: gpushare_grant_use gpushare_grant_use_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.gpushare_grant_use
    ADD CONSTRAINT gpushare_grant_use_pkey PRIMARY KEY (grant_id, gpu_uuid, month);


--
-- Name: gpushare_grants gpushare_grants_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.gpushare_grants
    ADD CONSTRAINT gpushare_grants_pkey PRIMARY KEY (id);


--
-- Name: gpushare_grants gpushare_grants_request_id_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.gpushare_grants
    ADD CONSTRAINT gpushare_grants_request_id_key UNIQUE (request_id);


--
-- Name: gpushare_heartbeats gpushare_heartbeats_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.gpushare_heartbeats
    ADD CONSTRAINT gpushare_heartbeats_pkey PRIMARY KEY (id);


--
-- Name: gpushare_job_events gpushare_job_events_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.gpushare_job_events
    ADD CONSTRAINT gpushare_job_events_pkey PRIMARY KEY (id);


--
-- Name: gpushare_job_notebooks gpushare_job_notebooks_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.gpushare_job_notebooks
    ADD CONSTRAINT gpushare_job_notebooks_pkey PRIMARY KEY (job_id);


--
-- Name: gpushare_jobs gpushare_jobs_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.gpushare_jobs
    ADD CONSTRAINT gpushare_jobs_pkey PRIMARY KEY (id);


--
-- Name: gpushare_node_power gpushare_node_power_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.gpushare_node_power
    ADD CONSTRAINT gpushare_node_power_pkey PRIMARY KEY (node, hour_start);


--
-- Name: gpushare_nodes gpushare_nodes_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.gpushare_nodes
    ADD CONSTRAINT gpushare_nodes_pkey PRIMARY KEY (name);


--
-- Name: gpushare_requests gpushare_requests_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.gpushare_requests
    ADD CONSTRAINT gpushare_requests_pkey PRIMARY KEY (id);


--
-- Name: gpushare_schema gpushare_schema_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.gpushare_schema
    ADD CONSTRAINT gpushare_schema_pkey PRIMARY KEY (id);


--
-- Name: gpushare_usage_month gpushare_usage_month_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.gpushare_usage_month
    ADD CONSTRAINT gpushare_usage_month_pkey PRIMARY KEY (team, pool, month);


--
-- Name: gpushare_requests uq_gpushare_request_idem; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.gpushare_requests
    ADD CONSTRAINT uq_gpushare_request_idem UNIQUE (username, idempotency_key);


--
-- Name: ix_gpushare_grants_live; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_gpushare_grants_live ON public.gpushare_grants USING btree (released_at);


--
-- Name: ix_gpushare_grants_period; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_gpushare_grants_period ON public.gpushare_grants USING btree (team, pool, granted_at);


--
-- Name: ix_gpushare_grants_user; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_gpushare_grants_user ON public.gpushare_grants USING btree (username);


--
-- Name: ix_gpushare_heartbeats_grant; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_gpushare_heartbeats_grant ON public.gpushare_heartbeats USING btree (grant_id, ts);


--
-- Name: ix_gpushare_heartbeats_ts; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_gpushare_heartbeats_ts ON public.gpushare_heartbeats USING btree (ts);


--
-- Name: ix_gpushare_job_events_job; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_gpushare_job_events_job ON public.gpushare_job_events USING btree (job_id, id);


--
-- Name: ix_gpushare_jobs_state; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_gpushare_jobs_state ON public.gpushare_jobs USING btree (state);


--
-- Name: ix_gpushare_jobs_user; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_gpushare_jobs_user ON public.gpushare_jobs USING btree (username, created_at);


--
-- Name: ix_gpushare_requests_status; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_gpushare_requests_status ON public.gpushare_requests USING btree (status);


--
-- Name: ix_gpushare_requests_user; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_gpushare_requests_user ON public.gpushare_requests USING btree (username);


--
-- PostgreSQL database dump complete
--

\unrestrict 6mDZ8PnZRl0Z5vqfMrfRzB47pALRmzAdJK8AaRc9SJIZAUlZNCwHBvVCfXPJdiA

