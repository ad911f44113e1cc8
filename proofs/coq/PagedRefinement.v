(* The paged cache refines the contiguous one: a model of core/paged.{h,cpp}'s block pool.

   The pool holds blocks of block_size slots. Each block has its contents (slot -> row), a
   reference count, a published flag with the rows it was published under (its key), and may sit
   on the free list. Each live sequence has an id, a block table (logical block -> physical
   block) and a length; it reads position t at slot t mod block_size of block
   table[t / block_size], as PagedCache::slot does. Beside the pool the model keeps, per sequence,
   the rows a private contiguous array would hold: the specification. A row stands for all of a
   position's K and V rows (every layer and head): the C++ moves them together.

   The operations are the C++ ones, named as in tests/test_pool_state.cpp:
     new_request s prefix  a new sequence mapping the published blocks of a prefix hit
                           (PagedCache's constructor + attach_prefix); the rest of the prompt
                           is appended
     append s r victim     one row (reserve + write): a fresh block at a block boundary; a
                           copy-on-write when the partial last block is shared or published;
                           else a write into the sequence's own block
     fork parent child     the child maps every block of the parent (each refcount + 1)
     rollback s n          truncate to n rows, releasing the blocks past ceil(n / block_size)
     free s                release every block and forget the sequence (the destructor)
     publish s i           full block i of s enters the prefix cache (on_stored + publish)
   A block comes from the free list, else by evicting an unreferenced published block, the one
   `victim` names. The C++ evicts the least recently used one; the model accepts any, so the
   theorems hold whatever the eviction order. An operation the pool cannot or must not do (no
   block to take, an unknown or already used sequence id, an unpublished block in a prefix, a
   rollback past the end, publishing a partial or published block) is refused and changes
   nothing, as the C++ throws before it changes anything (TooBig in the test).

   Proven for every sequence of operations from an empty pool, through one invariant (Inv)
   that every operation keeps:
   (a) paged_refines_contiguous: each live sequence reads, through its block table, exactly the
       rows of its contiguous array after the same requests, appends, forks and rollbacks;
   (b) refcount_counts_entries: a block's reference count is the number of block-table entries
       that map it;
   (c) free_blocks_unmapped: no block on the free list is mapped by any table;
   (d) other_sequences_unchanged: an operation on one sequence (an append's write included)
       leaves every other sequence as it was, reading the same rows;
   and published_blocks_keep_rows (a published block holds the rows it was published under)
   and refused_step_changes_nothing.

   What the model takes on trust or leaves out:
   - A published block's key is its rows, taken from the publishing sequence's array as the C++
     takes the key from its tokens. That the rows of a prefix hit are those the new request would
     compute is the hash's claim (parent hash, tokens, model identity): check_hit in the C++ test
     checks it, this file does not.
   - One append here is one row; the C++ Cache::append reserves several positions at once and
     refuses all of them when they do not fit. publish is an operation of its own; the C++
     publishes a block when its last row is stored (with prefix caching on), and skips a key
     that is already published.
   - Not modelled: LRU order, free-list order, events (trace), NaN poisoning of rows past a
     sequence's length and of freed blocks (the model promises only the rows below a length),
     hashes, the K/V layout of a block, memory accounting, and the counts n_free + n_cached +
     n_used = n_blocks.
   This file uses `blocks` (ceil(n / block_size)) and its bounds from Memory.v, which is compiled
   first. *)
(* main: paged_refines_contiguous refcount_counts_entries free_blocks_unmapped other_sequences_unchanged published_blocks_keep_rows refused_step_changes_nothing *)

From Coq Require Import List Arith Bool Lia.
From Kvlab Require Import Memory.
Import ListNotations.

Section Paged.
  Variable Row : Type.
  Variable block_size : nat.
  Hypothesis block_size_pos : 0 < block_size.

  (* ---------------------------------------------------------------------------------------- *)
  (* The state *)

  (* One sequence (a PagedCache): its id, block_table() and length(). *)
  Record sequence := mk_sequence { seq_id : nat; block_table : list nat; len : nat }.

  Record pool := mk_pool {
    contents : nat -> nat -> option Row;  (* block -> slot -> row, None where nothing was written *)
    refcount : nat -> nat;
    published : nat -> bool;
    key : nat -> list Row;                (* a published block's rows: what its hash stands for *)
    free_list : list nat;
    seqs : list sequence }.

  (* The specification: each sequence's private contiguous array of rows. *)
  Definition spec := nat -> list Row.

  Definition upd {A} (f : nat -> A) (k : nat) (v : A) : nat -> A :=
    fun x => if x =? k then v else f x.

  (* Position t of sequence q: slot t mod block_size of block table[t / block_size]. *)
  Definition read (p : pool) (q : sequence) (t : nat) : option Row :=
    match nth_error (block_table q) (t / block_size) with
    | Some b => contents p b (t mod block_size)
    | None => None
    end.

  Definition count (b : nat) (l : list nat) : nat := count_occ Nat.eq_dec l b.

  (* How many block-table entries, over all sequences, map block b. *)
  Fixpoint mapped (b : nat) (l : list sequence) : nat :=
    match l with
    | [] => 0
    | q :: r => count b (block_table q) + mapped b r
    end.

  Definition find_seq (s : nat) (l : list sequence) : option sequence :=
    find (fun q => seq_id q =? s) l.

  (* Every sequence but s. *)
  Definition others (s : nat) (l : list sequence) : list sequence :=
    filter (fun q => negb (seq_id q =? s)) l.

  (* ---------------------------------------------------------------------------------------- *)
  (* BlockPool *)

  Definition with_seqs (p : pool) (l : list sequence) : pool :=
    mk_pool (contents p) (refcount p) (published p) (key p) (free_list p) l.

  Definition write (p : pool) (b slot : nat) (r : Row) : pool :=
    mk_pool (upd (contents p) b (upd (contents p b) slot (Some r)))
      (refcount p) (published p) (key p) (free_list p) (seqs p).

  (* BlockPool::copy_block: the whole block. *)
  Definition copy_block (p : pool) (to from : nat) : pool :=
    mk_pool (upd (contents p) to (contents p from))
      (refcount p) (published p) (key p) (free_list p) (seqs p).

  (* Block b leaves the free list or the cache with refcount 1, unpublished and holding no row
     (the C++ poisons a block when it frees or evicts it). *)
  Definition take (p : pool) (b : nat) (rest : list nat) : nat * pool :=
    (b, mk_pool (upd (contents p) b (fun _ => None)) (upd (refcount p) b 1)
          (upd (published p) b false) (key p) rest (seqs p)).

  (* BlockPool::allocate: the free list first; when it is empty, evict `victim` if it is
     unreferenced and published (the C++ picks the least recently used such block). *)
  Definition allocate (p : pool) (victim : nat) : option (nat * pool) :=
    match free_list p with
    | b :: rest => Some (take p b rest)
    | [] =>
        if (refcount p victim =? 0) && published p victim then Some (take p victim []) else None
    end.

  (* BlockPool::retain. *)
  Definition retain (p : pool) (b : nat) : pool :=
    mk_pool (contents p) (upd (refcount p) b (S (refcount p b)))
      (published p) (key p) (free_list p) (seqs p).

  (* BlockPool::release: at refcount 0 a published block stays cached (evictable), any other
     goes back to the free list. *)
  Definition release (p : pool) (b : nat) : pool :=
    let n := refcount p b - 1 in
    mk_pool (contents p) (upd (refcount p) b n) (published p) (key p)
      (if (n =? 0) && negb (published p b) then b :: free_list p else free_list p) (seqs p).

  Definition retain_all (p : pool) (bl : list nat) : pool := fold_left retain bl p.
  Definition release_all (p : pool) (bl : list nat) : pool := fold_left release bl p.

  (* Entry i of a block table replaced by b (copy-on-write). *)
  Fixpoint replace (i b : nat) (l : list nat) : list nat :=
    match l with
    | [] => []
    | x :: r => match i with 0 => b :: r | S i' => x :: replace i' b r end
    end.

  (* ---------------------------------------------------------------------------------------- *)
  (* The operations *)

  Inductive op :=
  | new_request (s : nat) (prefix : list nat)
  | append (s : nat) (r : Row) (victim : nat)
  | fork (parent child : nat)
  | rollback (s n : nat)
  | free (s : nat)
  | publish (s i : nat).

  (* The sequence an operation acts on: every other one must be left alone. *)
  Definition target (o : op) : nat :=
    match o with
    | new_request s _ | append s _ _ | rollback s _ | free s | publish s _ => s
    | fork _ child => child
    end.

  (* What the pool does; None: refused. The spec c is read only by publish, for the key (the
     C++ keys a block by the sequence's tokens; the model by its rows). *)
  Definition pool_step (o : op) (p : pool) (c : spec) : option pool :=
    match o with
    | new_request s prefix =>
        match find_seq s (seqs p) with
        | Some _ => None
        | None =>
            if forallb (published p) prefix then
              Some (with_seqs (retain_all p prefix)
                      (mk_sequence s prefix (length prefix * block_size) :: seqs p))
            else None
        end
    | append s r victim =>
        match find_seq s (seqs p) with
        | None => None
        | Some q =>
            let slot := len q mod block_size in
            let i := len q / block_size in
            let b := nth i (block_table q) 0 in
            if slot =? 0 then
              (* At a block boundary: a fresh block. *)
              match allocate p victim with
              | Some (b', p1) =>
                  Some (with_seqs (write p1 b' 0 r)
                          (mk_sequence s (block_table q ++ [b']) (S (len q)) :: others s (seqs p)))
              | None => None
              end
            else if (refcount p b <=? 1) && negb (published p b) then
              (* Our own block: write in place. *)
              Some (with_seqs (write p b slot r)
                      (mk_sequence s (block_table q) (S (len q)) :: others s (seqs p)))
            else
              (* Shared or published: copy-on-write, then write into the copy. *)
              match allocate p victim with
              | Some (b', p1) =>
                  Some (with_seqs (write (release (copy_block p1 b' b) b) b' slot r)
                          (mk_sequence s (replace i b' (block_table q)) (S (len q))
                             :: others s (seqs p)))
              | None => None
              end
        end
    | fork parent child =>
        match find_seq parent (seqs p), find_seq child (seqs p) with
        | Some q, None =>
            Some (with_seqs (retain_all p (block_table q))
                    (mk_sequence child (block_table q) (len q) :: seqs p))
        | _, _ => None
        end
    | rollback s n =>
        match find_seq s (seqs p) with
        | Some q =>
            if n <=? len q then
              let keep := blocks block_size n in
              Some (with_seqs (release_all p (skipn keep (block_table q)))
                      (mk_sequence s (firstn keep (block_table q)) n :: others s (seqs p)))
            else None
        | None => None
        end
    | free s =>
        match find_seq s (seqs p) with
        | Some q => Some (with_seqs (release_all p (block_table q)) (others s (seqs p)))
        | None => None
        end
    | publish s i =>
        match find_seq s (seqs p) with
        | Some q =>
            let b := nth i (block_table q) 0 in
            if (S i * block_size <=? len q) && negb (published p b) then
              Some (mk_pool (contents p) (refcount p) (upd (published p) b true)
                      (upd (key p) b (firstn block_size (skipn (i * block_size) (c s))))
                      (free_list p) (seqs p))
            else None
        | None => None
        end
    end.

  (* What a private contiguous array does under the same operation; `hit` is the rows a prefix
     hit serves. *)
  Definition contiguous (c : spec) (o : op) (hit : list Row) : spec :=
    match o with
    | new_request s _ => upd c s hit
    | append s r _ => upd c s (c s ++ [r])
    | fork parent child => upd c child (c parent)
    | rollback s n => upd c s (firstn n (c s))
    | free _ | publish _ _ => c
    end.

  Definition hit_rows (p : pool) (o : op) : list Row :=
    match o with
    | new_request _ prefix => concat (map (key p) prefix)
    | _ => []
    end.

  (* One operation on both; a refused one changes neither. *)
  Definition step (st : pool * spec) (o : op) : pool * spec :=
    let '(p, c) := st in
    match pool_step o p c with
    | Some p' => (p', contiguous c o (hit_rows p o))
    | None => (p, c)
    end.

  Definition empty_pool (n_blocks : nat) : pool :=
    mk_pool (fun _ _ => None) (fun _ => 0) (fun _ => false) (fun _ => [])
      (List.seq 0 n_blocks) [].

  Definition run (n_blocks : nat) (ops : list op) : pool * spec :=
    fold_left step ops (empty_pool n_blocks, fun _ => []).

  (* ---------------------------------------------------------------------------------------- *)
  (* The invariant *)

  Record Inv (p : pool) (c : spec) : Prop := {
    ids_distinct : NoDup (map seq_id (seqs p));
    refcount_mapped : forall b, refcount p b = mapped b (seqs p);
    free_distinct : NoDup (free_list p);
    free_unused : forall b, In b (free_list p) -> refcount p b = 0 /\ published p b = false;
    published_rows : forall b, published p b = true ->
      length (key p b) = block_size /\
      forall j, j < block_size -> contents p b j = nth_error (key p b) j;
    seq_shape : forall q, In q (seqs p) ->
      length (c (seq_id q)) = len q /\
      len q <= length (block_table q) * block_size < len q + block_size;
    seq_rows : forall q t, In q (seqs p) -> t < len q -> read p q t = nth_error (c (seq_id q)) t
  }.

  (* ---------------------------------------------------------------------------------------- *)
  (* Lemmas: updates, counts, the list of sequences *)

  Lemma upd_eq : forall A (f : nat -> A) k v, upd f k v k = v.
  Proof. intros. unfold upd. rewrite Nat.eqb_refl. reflexivity. Qed.

  Lemma upd_neq : forall A (f : nat -> A) k v x, x <> k -> upd f k v x = f x.
  Proof. intros A f k v x H. unfold upd. destruct (Nat.eqb_spec x k); congruence. Qed.

  Lemma count_app : forall b l1 l2, count b (l1 ++ l2) = count b l1 + count b l2.
  Proof. intros. unfold count. apply count_occ_app. Qed.

  Lemma count_one : forall b x, count b [x] = if Nat.eq_dec x b then 1 else 0.
  Proof. intros. reflexivity. Qed.

  Lemma count_in : forall b l, In b l -> 1 <= count b l.
  Proof. intros b l H. unfold count. apply (count_occ_In Nat.eq_dec) in H. lia. Qed.

  Lemma count_not_in : forall b l, count b l = 0 -> ~ In b l.
  Proof. intros b l H Hin. apply count_in in Hin. lia. Qed.

  Lemma mapped_in : forall b l q, In q l -> count b (block_table q) <= mapped b l.
  Proof.
    induction l as [| x r IH]; simpl; intros q H; [contradiction |].
    destruct H as [<- | H]; [lia |]. specialize (IH q H). lia.
  Qed.

  (* A block no table entry maps is in no table. *)
  Lemma unmapped_not_in : forall b l q, mapped b l = 0 -> In q l -> ~ In b (block_table q).
  Proof.
    intros b l q H Hq. apply count_not_in. pose proof (mapped_in b l q Hq). lia.
  Qed.

  Lemma in_others : forall s l q, In q (others s l) <-> In q l /\ seq_id q <> s.
  Proof.
    intros s l q. unfold others. rewrite filter_In.
    destruct (Nat.eqb_spec (seq_id q) s); simpl; split; intros [H1 H2]; auto; try discriminate;
      congruence.
  Qed.

  Lemma others_not_in : forall s l, ~ In s (map seq_id (others s l)).
  Proof.
    intros s l H. apply in_map_iff in H as [q [Hq Hin]]. apply in_others in Hin. tauto.
  Qed.

  Lemma others_nodup : forall s l, NoDup (map seq_id l) -> NoDup (map seq_id (others s l)).
  Proof.
    induction l as [| x r IH]; simpl; intros H; [constructor |].
    inversion H as [| ? ? Hx Hr]; subst.
    destruct (negb (seq_id x =? s)); simpl; auto.
    constructor; auto. intro Hin. apply Hx. apply in_map_iff in Hin as [q [Hq Hin]].
    apply in_map_iff. exists q. split; auto. unfold others in Hin. apply filter_In in Hin. tauto.
  Qed.

  Lemma others_all : forall s l, ~ In s (map seq_id l) -> others s l = l.
  Proof.
    induction l as [| x r IH]; simpl; intros H; auto.
    destruct (Nat.eqb_spec (seq_id x) s); [tauto |]. simpl. rewrite IH; auto.
  Qed.

  (* The entries of a table split into those of one sequence and those of the others. *)
  Lemma mapped_others : forall b l q, NoDup (map seq_id l) -> In q l ->
    mapped b l = count b (block_table q) + mapped b (others (seq_id q) l).
  Proof.
    induction l as [| x r IH]; simpl; intros q Hnd Hin; [contradiction |].
    inversion Hnd as [| ? ? Hx Hr]; subst.
    destruct Hin as [<- | Hin].
    - rewrite Nat.eqb_refl. simpl. rewrite others_all; auto.
    - assert (seq_id x <> seq_id q) by (intro E; apply Hx; rewrite E; apply in_map; auto).
      destruct (Nat.eqb_spec (seq_id x) (seq_id q)); [contradiction |]. simpl.
      rewrite (IH q Hr Hin). lia.
  Qed.

  Lemma find_seq_some : forall s l q, find_seq s l = Some q -> In q l /\ seq_id q = s.
  Proof.
    intros s l q H. apply find_some in H as [H1 H2]. apply Nat.eqb_eq in H2. auto.
  Qed.

  Lemma find_seq_none : forall s l, find_seq s l = None -> forall q, In q l -> seq_id q <> s.
  Proof.
    intros s l H q Hq E. apply (find_none _ _ H) in Hq. rewrite E, Nat.eqb_refl in Hq. discriminate.
  Qed.

  Lemma not_in_ids : forall s l, (forall q, In q l -> seq_id q <> s) -> ~ In s (map seq_id l).
  Proof. intros s l H Hin. apply in_map_iff in Hin as [q [Hq Hin]]. exact (H q Hin Hq). Qed.

  Lemma read_same : forall p p' q t, contents p' = contents p -> read p' q t = read p q t.
  Proof. intros p p' q t H. unfold read. rewrite H. reflexivity. Qed.

  (* A sequence reads the same where the contents of its blocks did not change. *)
  Lemma read_frame : forall p p' q t,
    (forall b j, In b (block_table q) -> contents p' b j = contents p b j) ->
    read p' q t = read p q t.
  Proof.
    intros p p' q t H. unfold read.
    destruct (nth_error (block_table q) (t / block_size)) eqn:E; auto.
    apply H. eapply nth_error_In; eauto.
  Qed.

  (* ---------------------------------------------------------------------------------------- *)
  (* Lemmas: block tables and positions *)

  Lemma replace_length : forall i b l, length (replace i b l) = length l.
  Proof. intros i b l. revert i. induction l; intros [| i]; simpl; auto. Qed.

  Lemma nth_error_replace : forall l i b j, i < length l ->
    nth_error (replace i b l) j = if j =? i then Some b else nth_error l j.
  Proof.
    induction l as [| x r IH]; simpl; intros i b j H; [lia |].
    destruct i, j; simpl; auto. apply IH. lia.
  Qed.

  Lemma count_replace : forall l i b x, i < length l ->
    count x (replace i b l) + count x [nth i l 0] = count x l + count x [b].
  Proof.
    unfold count. induction l as [| y r IH]; simpl; intros i b x H; [lia |].
    destruct i; simpl.
    - destruct (Nat.eq_dec b x), (Nat.eq_dec y x); lia.
    - specialize (IH i b x ltac:(lia)). simpl in IH. destruct (Nat.eq_dec y x); lia.
  Qed.

  (* A block entered once in a table is at one index. *)
  Lemma count_one_index : forall l b i j, count b l <= 1 ->
    nth_error l i = Some b -> nth_error l j = Some b -> i = j.
  Proof.
    unfold count. induction l as [| x r IH]; intros b i j Hc Hi Hj; [destruct i; discriminate |].
    simpl in Hc. destruct i, j; simpl in Hi, Hj; auto.
    - injection Hi as ->. destruct (Nat.eq_dec b b); [| congruence].
      apply nth_error_In, (count_occ_In Nat.eq_dec) in Hj. lia.
    - injection Hj as ->. destruct (Nat.eq_dec b b); [| congruence].
      apply nth_error_In, (count_occ_In Nat.eq_dec) in Hi. lia.
    - f_equal. apply (IH b); auto. destruct (Nat.eq_dec x b); lia.
  Qed.

  Lemma nth_error_firstn_lt : forall A (l : list A) n t,
    t < n -> nth_error (firstn n l) t = nth_error l t.
  Proof.
    intros A l. induction l as [| x r IH]; intros n t H; destruct n, t; simpl; auto; try lia.
    apply IH. lia.
  Qed.

  Lemma nth_error_skipn_add : forall A (l : list A) k t,
    nth_error (skipn k l) t = nth_error l (k + t).
  Proof. intros A l. induction l as [| x r IH]; intros [| k] t; simpl; auto; destruct t; auto. Qed.

  Lemma bs_nz : block_size <> 0.
  Proof. lia. Qed.

  Lemma div_lt : forall t k, t < k * block_size -> t / block_size < k.
  Proof. intros t k H. apply Nat.div_lt_upper_bound; [apply bs_nz | lia]. Qed.

  (* At a block boundary a table with room for exactly n positions has n / block_size blocks. *)
  Lemma boundary_blocks : forall n k, n mod block_size = 0 ->
    n <= k * block_size < n + block_size -> n = k * block_size /\ n / block_size = k.
  Proof.
    intros n k Hm Hk. pose proof (Nat.div_mod n block_size bs_nz) as D. rewrite Hm in D.
    assert (n / block_size = k) by nia. subst k. split; lia.
  Qed.

  (* Inside a block, the table has room for one more position, and n's block is in the table. *)
  Lemma partial_block : forall n k, n mod block_size <> 0 -> n <= k * block_size ->
    n < k * block_size /\ n / block_size < k.
  Proof.
    intros n k Hm Hk.
    assert (n <> k * block_size) by (intro E; apply Hm; rewrite E; apply Nat.mod_mul, bs_nz).
    split; [lia | apply div_lt; lia].
  Qed.

  (* Two positions of one block: the earlier is at an earlier slot. *)
  Lemma same_block_slot : forall t n, t < n -> t / block_size = n / block_size ->
    t mod block_size < n mod block_size.
  Proof.
    intros t n Ht Hq. pose proof (Nat.div_mod t block_size bs_nz).
    pose proof (Nat.div_mod n block_size bs_nz). nia.
  Qed.

  Lemma position_in_block : forall i j, j < block_size ->
    (i * block_size + j) / block_size = i /\ (i * block_size + j) mod block_size = j.
  Proof.
    intros i j H. split.
    - symmetry. apply (Nat.div_unique _ _ _ j); lia.
    - symmetry. apply (Nat.mod_unique _ _ i); lia.
  Qed.

  (* Rows published block by block, concatenated: position t is in chunk t / block_size. *)
  Lemma nth_error_concat : forall (l : list (list Row)) t,
    Forall (fun x => length x = block_size) l ->
    nth_error (concat l) t =
      match nth_error l (t / block_size) with
      | Some x => nth_error x (t mod block_size)
      | None => None
      end.
  Proof.
    induction l as [| x r IH]; intros t H; simpl.
    - destruct (t / block_size); destruct t; reflexivity.
    - pose proof (Forall_inv H) as Hx. pose proof (Forall_inv_tail H) as Hr. cbv beta in Hx.
      destruct (Nat.lt_ge_cases t block_size) as [Ht | Ht].
      + rewrite nth_error_app1 by lia. rewrite Nat.div_small, Nat.mod_small by lia. reflexivity.
      + rewrite nth_error_app2 by lia. rewrite IH by auto. rewrite Hx.
        replace (t / block_size) with ((t - block_size) / block_size + 1)
          by (rewrite <- Nat.div_add by apply bs_nz; f_equal; lia).
        replace (t mod block_size) with ((t - block_size) mod block_size)
          by (rewrite <- (Nat.mod_add _ 1) by apply bs_nz; f_equal; lia).
        rewrite Nat.add_1_r. reflexivity.
  Qed.

  Lemma length_concat : forall (l : list (list Row)),
    Forall (fun x => length x = block_size) l -> length (concat l) = length l * block_size.
  Proof.
    induction l as [| x r IH]; intros H; simpl; auto.
    rewrite app_length, IH by exact (Forall_inv_tail H). rewrite (Forall_inv H). reflexivity.
  Qed.

  (* ---------------------------------------------------------------------------------------- *)
  (* Lemmas: what allocate, retain and release do *)

  Lemma allocate_spec : forall p v b p1,
    NoDup (free_list p) ->
    (forall x, In x (free_list p) -> refcount p x = 0 /\ published p x = false) ->
    allocate p v = Some (b, p1) ->
    refcount p b = 0 /\
    contents p1 = upd (contents p) b (fun _ => None) /\ refcount p1 = upd (refcount p) b 1 /\
    published p1 = upd (published p) b false /\ key p1 = key p /\ seqs p1 = seqs p /\
    NoDup (free_list p1) /\ (forall x, In x (free_list p1) -> x <> b /\ In x (free_list p)).
  Proof.
    intros p v b p1 Hnd Hfree. unfold allocate, take.
    destruct (free_list p) as [| b0 rest] eqn:E.
    - destruct ((refcount p v =? 0) && published p v) eqn:C; [| discriminate].
      apply andb_prop in C as [C _]. apply Nat.eqb_eq in C.
      intros H; injection H as <- <-. simpl.
      repeat split; auto.
    - intros H; injection H as <- <-. simpl. inversion Hnd as [| ? ? Hb0 Hrest]; subst.
      destruct (Hfree b0 (or_introl eq_refl)) as [Hr _].
      repeat split; auto. intros Ex; subst; contradiction.
  Qed.

  Lemma retain_all_spec : forall bl p,
    contents (retain_all p bl) = contents p /\ published (retain_all p bl) = published p /\
    key (retain_all p bl) = key p /\ free_list (retain_all p bl) = free_list p /\
    seqs (retain_all p bl) = seqs p /\
    forall b, refcount (retain_all p bl) b = refcount p b + count b bl.
  Proof.
    unfold retain_all, count. induction bl as [| b0 bl IH]; intros p; simpl.
    - repeat split; auto.
    - destruct (IH (retain p b0)) as (Hc & Hp & Hk & Hf & Hs & Hr).
      repeat split; auto. intros b. rewrite Hr. simpl. unfold upd.
      destruct (Nat.eqb_spec b b0), (Nat.eq_dec b0 b); subst; try congruence; lia.
  Qed.

  (* Releasing entries that exist: each count drops by the entries released, and a block reaching
     0 joins the free list (once) unless it is published. *)
  Lemma release_all_spec : forall bl p,
    (forall b, count b bl <= refcount p b) ->
    NoDup (free_list p) ->
    (forall b, In b (free_list p) -> refcount p b = 0 /\ published p b = false) ->
    contents (release_all p bl) = contents p /\ published (release_all p bl) = published p /\
    key (release_all p bl) = key p /\ seqs (release_all p bl) = seqs p /\
    (forall b, refcount (release_all p bl) b = refcount p b - count b bl) /\
    NoDup (free_list (release_all p bl)) /\
    (forall b, In b (free_list (release_all p bl)) ->
       refcount (release_all p bl) b = 0 /\ published (release_all p bl) b = false).
  Proof.
    unfold release_all. induction bl as [| b0 bl IH]; intros p Hcount Hnd Hfree; simpl.
    - repeat split; auto; intros; [unfold count; simpl; lia | apply Hfree; auto..].
    - assert (H0 : 1 <= refcount p b0).
      { specialize (Hcount b0). unfold count in Hcount. simpl in Hcount.
        destruct (Nat.eq_dec b0 b0); [lia | congruence]. }
      destruct (IH (release p b0)) as (Hc & Hp & Hk & Hs & Hr & Hnd' & Hf').
      + intros b. specialize (Hcount b). unfold release, count in *. simpl in *. unfold upd.
        destruct (Nat.eqb_spec b b0), (Nat.eq_dec b0 b); subst; try congruence; lia.
      + unfold release. simpl.
        destruct ((refcount p b0 - 1 =? 0) && negb (published p b0)); auto.
        constructor; auto. intros Hin. apply Hfree in Hin. lia.
      + unfold release. simpl. intros b Hb.
        destruct ((refcount p b0 - 1 =? 0) && negb (published p b0)) eqn:C.
        * apply andb_prop in C as [C1 C2]. apply Nat.eqb_eq in C1. apply negb_true_iff in C2.
          destruct Hb as [<- | Hb]; [rewrite upd_eq; auto |].
          destruct (Hfree b Hb). rewrite upd_neq; auto. intros ->. lia.
        * destruct (Hfree b Hb). rewrite upd_neq; auto. intros ->. lia.
      + unfold release in Hc, Hp, Hk, Hs, Hr. simpl in Hc, Hp, Hk, Hs, Hr.
        do 4 (split; [auto |]). split; [| split; auto].
        intros b. rewrite Hr. unfold upd, count. simpl.
        destruct (Nat.eqb_spec b b0), (Nat.eq_dec b0 b); subst; try congruence; lia.
  Qed.

  Lemma release_one : forall p b, release p b = release_all p [b].
  Proof. reflexivity. Qed.

  (* Facts every invariant-keeping pool gives. *)
  Lemma mapped_not_free : forall p c q b, Inv p c -> In q (seqs p) -> In b (block_table q) ->
    1 <= refcount p b /\ ~ In b (free_list p).
  Proof.
    intros p c q b Hinv Hq Hb.
    assert (1 <= refcount p b).
    { rewrite (refcount_mapped _ _ Hinv). pose proof (mapped_in b _ q Hq).
      pose proof (count_in b _ Hb). lia. }
    split; auto. intros Hf. apply (free_unused _ _ Hinv) in Hf. lia.
  Qed.

  Lemma unreferenced_unmapped : forall p c q b, Inv p c -> refcount p b = 0 -> In q (seqs p) ->
    ~ In b (block_table q).
  Proof.
    intros p c q b Hinv H0 Hq. apply (unmapped_not_in b (seqs p)); auto.
    rewrite <- (refcount_mapped _ _ Hinv). auto.
  Qed.

  (* A sequence's entries, and the others'. *)
  Lemma refcount_split : forall p c q, Inv p c -> In q (seqs p) ->
    forall x, refcount p x = count x (block_table q) + mapped x (others (seq_id q) (seqs p)).
  Proof.
    intros p c q Hinv Hq x. rewrite (refcount_mapped _ _ Hinv).
    apply mapped_others; auto. apply (ids_distinct _ _ Hinv).
  Qed.

  (* What is left to check when an operation replaces sequence q by q' and its rows by v. *)
  Lemma replace_seq_inv : forall p c p' q q' v,
    Inv p c -> In q (seqs p) -> seq_id q' = seq_id q ->
    seqs p' = q' :: others (seq_id q) (seqs p) ->
    (forall x, refcount p' x = count x (block_table q') + mapped x (others (seq_id q) (seqs p))) ->
    NoDup (free_list p') ->
    (forall x, In x (free_list p') -> refcount p' x = 0 /\ published p' x = false) ->
    (forall x, published p' x = true -> length (key p' x) = block_size /\
       forall j, j < block_size -> contents p' x j = nth_error (key p' x) j) ->
    length v = len q' -> len q' <= length (block_table q') * block_size < len q' + block_size ->
    (forall t, t < len q' -> read p' q' t = nth_error v t) ->
    (forall q0 x j, In q0 (others (seq_id q) (seqs p)) -> In x (block_table q0) ->
       contents p' x j = contents p x j) ->
    Inv p' (upd c (seq_id q) v).
  Proof.
    intros p c p' q q' v Hinv Hq Hid Hseqs Hr Hnd Hf Hp Hlen Hshape Hrows Hframe.
    constructor; rewrite ?Hseqs.
    - simpl. rewrite Hid.
      constructor; [apply others_not_in | apply others_nodup, (ids_distinct _ _ Hinv)].
    - intros x. rewrite Hr. simpl. reflexivity.
    - exact Hnd.
    - exact Hf.
    - exact Hp.
    - intros q0 [<- | Hq0]; simpl.
      + rewrite Hid, upd_eq. auto.
      + apply in_others in Hq0 as [Hq0 Hne]. rewrite upd_neq by auto.
        apply (seq_shape _ _ Hinv); auto.
    - intros q0 t [<- | Hq0] Ht.
      + rewrite Hid, upd_eq. auto.
      + pose proof Hq0 as Hq0'. apply in_others in Hq0' as [Hin Hne]. rewrite upd_neq by auto.
        rewrite (read_frame p p'); [apply (seq_rows _ _ Hinv); auto |].
        intros x j Hx. apply (Hframe q0); auto.
  Qed.

  Lemma write_refcount : forall p b j r, refcount (write p b j r) = refcount p.
  Proof. reflexivity. Qed.
  Lemma write_published : forall p b j r, published (write p b j r) = published p.
  Proof. reflexivity. Qed.
  Lemma write_key : forall p b j r, key (write p b j r) = key p.
  Proof. reflexivity. Qed.
  Lemma write_free_list : forall p b j r, free_list (write p b j r) = free_list p.
  Proof. reflexivity. Qed.
  Lemma copy_refcount : forall p to from, refcount (copy_block p to from) = refcount p.
  Proof. reflexivity. Qed.
  Lemma copy_published : forall p to from, published (copy_block p to from) = published p.
  Proof. reflexivity. Qed.
  Lemma copy_key : forall p to from, key (copy_block p to from) = key p.
  Proof. reflexivity. Qed.
  Lemma copy_free_list : forall p to from, free_list (copy_block p to from) = free_list p.
  Proof. reflexivity. Qed.

  Ltac fields := rewrite ?write_refcount, ?write_published, ?write_key, ?write_free_list,
    ?copy_refcount, ?copy_published, ?copy_key, ?copy_free_list in *.
  Ltac proj :=
    cbn [with_seqs seqs contents refcount published key free_list block_table seq_id len mapped]
      in *.

  (* ---------------------------------------------------------------------------------------- *)
  (* Every operation keeps the invariant *)

  Lemma new_request_inv : forall p c s prefix p',
    Inv p c -> pool_step (new_request s prefix) p c = Some p' ->
    Inv p' (upd c s (concat (map (key p) prefix))).
  Proof.
    intros p c s prefix p' Hinv H. cbn [pool_step] in H.
    destruct (find_seq s (seqs p)) eqn:F; [discriminate |].
    destruct (forallb (published p) prefix) eqn:Fa; [| discriminate].
    injection H as <-. rewrite forallb_forall in Fa.
    pose proof (find_seq_none _ _ F) as Hnew.
    destruct (retain_all_spec prefix p) as (Hc & Hp & Hk & Hf & Hs & Hr).
    assert (Hlens : Forall (fun x => length x = block_size) (map (key p) prefix)).
    { apply Forall_forall. intros x Hx. apply in_map_iff in Hx as [b [<- Hb]].
      apply (published_rows _ _ Hinv b (Fa b Hb)). }
    constructor; proj.
    - constructor; [apply not_in_ids; auto | apply (ids_distinct _ _ Hinv)].
    - intros b. rewrite Hr, (refcount_mapped _ _ Hinv). lia.
    - rewrite Hf. apply (free_distinct _ _ Hinv).
    - intros b Hb. rewrite Hf in Hb. rewrite Hr, Hp.
      destruct (free_unused _ _ Hinv b Hb) as [H0 H1].
      split; auto. assert (~ In b prefix) by (intro Hin; apply Fa in Hin; congruence).
      unfold count. rewrite (proj1 (count_occ_not_In _ _ _) H). lia.
    - intros b. rewrite Hp, Hk, Hc. apply (published_rows _ _ Hinv).
    - intros q [<- | Hq]; proj.
      + rewrite upd_eq, length_concat, map_length by auto. lia.
      + rewrite upd_neq by (apply Hnew; auto). apply (seq_shape _ _ Hinv); auto.
    - intros q t [<- | Hq] Ht; proj.
      + rewrite upd_eq, nth_error_concat by auto. unfold read. proj. rewrite Hc, nth_error_map.
        destruct (nth_error prefix (t / block_size)) as [b |] eqn:E; cbn [option_map]; auto.
        apply (published_rows _ _ Hinv b (Fa b (nth_error_In _ _ E))), Nat.mod_upper_bound, bs_nz.
      + rewrite upd_neq by (apply Hnew; auto). rewrite (read_same p) by auto.
        apply (seq_rows _ _ Hinv); auto.
  Qed.

  Lemma fork_inv : forall p c parent child p',
    Inv p c -> pool_step (fork parent child) p c = Some p' -> Inv p' (upd c child (c parent)).
  Proof.
    intros p c parent child p' Hinv H. cbn [pool_step] in H.
    destruct (find_seq parent (seqs p)) as [q |] eqn:F1; [| discriminate].
    destruct (find_seq child (seqs p)) eqn:F2; [discriminate |].
    injection H as <-.
    apply find_seq_some in F1 as [Hq <-]. pose proof (find_seq_none _ _ F2) as Hnew.
    destruct (retain_all_spec (block_table q) p) as (Hc & Hp & Hk & Hf & Hs & Hr).
    constructor; proj.
    - constructor; [apply not_in_ids; auto | apply (ids_distinct _ _ Hinv)].
    - intros b. rewrite Hr, (refcount_mapped _ _ Hinv). lia.
    - rewrite Hf. apply (free_distinct _ _ Hinv).
    - intros b Hb. rewrite Hf in Hb. rewrite Hr, Hp.
      destruct (free_unused _ _ Hinv b Hb) as [H0 H1].
      split; auto.
      assert (~ In b (block_table q))
        by (intro Hin; apply (mapped_not_free p c q b Hinv Hq Hin); auto).
      unfold count. rewrite (proj1 (count_occ_not_In _ _ _) H). lia.
    - intros b. rewrite Hp, Hk, Hc. apply (published_rows _ _ Hinv).
    - intros q0 [<- | Hq0]; proj.
      + rewrite upd_eq. apply (seq_shape _ _ Hinv); auto.
      + rewrite upd_neq by (apply Hnew; auto). apply (seq_shape _ _ Hinv); auto.
    - intros q0 t [<- | Hq0] Ht; proj.
      + rewrite upd_eq. unfold read. proj. rewrite Hc. apply (seq_rows _ _ Hinv q t Hq Ht).
      + rewrite upd_neq by (apply Hnew; auto). rewrite (read_same p) by auto.
        apply (seq_rows _ _ Hinv); auto.
  Qed.

  Lemma rollback_inv : forall p c s n p',
    Inv p c -> pool_step (rollback s n) p c = Some p' -> Inv p' (upd c s (firstn n (c s))).
  Proof.
    intros p c s n p' Hinv H. cbn [pool_step] in H.
    destruct (find_seq s (seqs p)) as [q |] eqn:F; [| discriminate].
    destruct (n <=? len q) eqn:Hn; [| discriminate]. apply Nat.leb_le in Hn.
    injection H as <-. apply find_seq_some in F as [Hq <-].
    destruct (seq_shape _ _ Hinv q Hq) as [Hlen Hsh].
    pose proof (blocks_bounds block_size n block_size_pos) as Hk.
    assert (Hkeep : blocks block_size n <= length (block_table q)).
    { destruct (Nat.le_gt_cases (blocks block_size n) (length (block_table q))); auto. nia. }
    assert (Hsplit : forall x, count x (block_table q) =
      count x (firstn (blocks block_size n) (block_table q)) +
      count x (skipn (blocks block_size n) (block_table q))).
    { intros x. rewrite <- count_app, firstn_skipn. reflexivity. }
    pose proof (refcount_split p c q Hinv Hq) as Hm.
    destruct (release_all_spec (skipn (blocks block_size n) (block_table q)) p)
      as (Hc & Hp & Hk' & Hs & Hr & Hnd & Hf).
    { intros x. rewrite Hm, Hsplit. lia. }
    { apply (free_distinct _ _ Hinv). }
    { apply (free_unused _ _ Hinv). }
    apply (replace_seq_inv p c _ q
             (mk_sequence (seq_id q) (firstn (blocks block_size n) (block_table q)) n)); proj; auto.
    - intros x. rewrite Hr, Hm, Hsplit. lia.
    - intros x. rewrite Hp, Hk', Hc. apply (published_rows _ _ Hinv).
    - rewrite firstn_length_le; lia.
    - rewrite firstn_length_le by lia. lia.
    - intros t Ht. unfold read. proj. rewrite Hc.
      rewrite nth_error_firstn_lt by (apply div_lt; lia).
      rewrite nth_error_firstn_lt by lia. apply (seq_rows _ _ Hinv q t Hq). lia.
    - intros q0 x j _ _. rewrite Hc. reflexivity.
  Qed.

  Lemma free_inv : forall p c s p', Inv p c -> pool_step (free s) p c = Some p' -> Inv p' c.
  Proof.
    intros p c s p' Hinv H. cbn [pool_step] in H.
    destruct (find_seq s (seqs p)) as [q |] eqn:F; [| discriminate].
    injection H as <-. apply find_seq_some in F as [Hq <-].
    pose proof (refcount_split p c q Hinv Hq) as Hm.
    destruct (release_all_spec (block_table q) p) as (Hc & Hp & Hk & Hs & Hr & Hnd & Hf).
    { intros x. rewrite Hm. lia. }
    { apply (free_distinct _ _ Hinv). }
    { apply (free_unused _ _ Hinv). }
    constructor; proj; auto.
    - apply others_nodup, (ids_distinct _ _ Hinv).
    - intros x. rewrite Hr, Hm. lia.
    - intros x. rewrite Hp, Hk, Hc. apply (published_rows _ _ Hinv).
    - intros q0 Hq0. apply in_others in Hq0 as [Hq0 _]. apply (seq_shape _ _ Hinv); auto.
    - intros q0 t Hq0 Ht. apply in_others in Hq0 as [Hq0 _]. rewrite (read_same p) by auto.
      apply (seq_rows _ _ Hinv); auto.
  Qed.

  Lemma publish_inv : forall p c s i p',
    Inv p c -> pool_step (publish s i) p c = Some p' -> Inv p' c.
  Proof.
    intros p c s i p' Hinv H. cbn [pool_step] in H.
    destruct (find_seq s (seqs p)) as [q |] eqn:F; [| discriminate].
    destruct ((S i * block_size <=? len q) && negb (published p (nth i (block_table q) 0))) eqn:C;
      [| discriminate].
    apply andb_prop in C as [C1 C2]. apply Nat.leb_le in C1. apply negb_true_iff in C2.
    injection H as <-. apply find_seq_some in F as [Hq <-].
    destruct (seq_shape _ _ Hinv q Hq) as [Hlen Hsh].
    assert (Hi : i < length (block_table q)).
    { destruct (Nat.lt_ge_cases i (length (block_table q))); auto. nia. }
    assert (Hb : nth_error (block_table q) i = Some (nth i (block_table q) 0))
      by (apply nth_error_nth'; auto).
    set (b := nth i (block_table q) 0) in *.
    destruct (mapped_not_free p c q b Hinv Hq (nth_error_In _ _ Hb)) as [_ Hbfree].
    constructor; proj.
    - apply (ids_distinct _ _ Hinv).
    - apply (refcount_mapped _ _ Hinv).
    - apply (free_distinct _ _ Hinv).
    - intros x Hx. destruct (free_unused _ _ Hinv x Hx).
      rewrite upd_neq; auto. intros ->. contradiction.
    - intros x Hx. destruct (Nat.eq_dec x b) as [-> | Hne].
      + rewrite upd_eq. split.
        * rewrite firstn_length_le; auto. rewrite skipn_length. nia.
        * intros j Hj. rewrite nth_error_firstn_lt, nth_error_skipn_add by auto.
          destruct (position_in_block i j Hj) as [Hd Hm].
          rewrite <- (seq_rows _ _ Hinv q _ Hq) by nia.
          unfold read. rewrite Hd, Hb, Hm. reflexivity.
      + rewrite upd_neq in Hx |- * by auto. apply (published_rows _ _ Hinv); auto.
    - apply (seq_shape _ _ Hinv).
    - intros q0 t Hq0 Ht. apply (seq_rows _ _ Hinv); auto.
  Qed.

  (* The three ways of appending a row: a fresh block, a write in place, a copy-on-write. *)
  Lemma append_inv : forall p c s r v p',
    Inv p c -> pool_step (append s r v) p c = Some p' -> Inv p' (upd c s (c s ++ [r])).
  Proof.
    intros p c s r v p' Hinv H. cbn [pool_step] in H.
    destruct (find_seq s (seqs p)) as [q |] eqn:F; [| discriminate].
    apply find_seq_some in F as [Hq <-].
    destruct (seq_shape _ _ Hinv q Hq) as [Hlen Hsh].
    pose proof (refcount_split p c q Hinv Hq) as Hm.
    (* The contiguous array: r lands at position len q, the rows below it stay. *)
    assert (Hnew : nth_error (c (seq_id q) ++ [r]) (len q) = Some r).
    { rewrite nth_error_app2 by lia. rewrite Hlen, Nat.sub_diag. reflexivity. }
    assert (Hold : forall t, t < len q ->
      nth_error (c (seq_id q) ++ [r]) t = nth_error (c (seq_id q)) t).
    { intros t Ht. apply nth_error_app1. lia. }
    assert (Hlen' : length (c (seq_id q) ++ [r]) = S (len q)) by (rewrite app_length; simpl; lia).
    destruct (len q mod block_size =? 0) eqn:Hslot.
    - (* At a block boundary: a fresh block, which no table maps. *)
      apply Nat.eqb_eq in Hslot.
      destruct (allocate p v) as [[b' p1] |] eqn:A; [| discriminate]. injection H as <-.
      destruct (allocate_spec p v b' p1 (free_distinct _ _ Hinv) (free_unused _ _ Hinv) A)
        as (H0 & Hc1 & Hr1 & Hp1 & Hk1 & Hs1 & Hnd1 & Hf1).
      assert (Hb'q : ~ In b' (block_table q)) by (apply (unreferenced_unmapped p c); auto).
      assert (Hb'o : mapped b' (others (seq_id q) (seqs p)) = 0) by (specialize (Hm b'); lia).
      destruct (boundary_blocks (len q) (length (block_table q)) Hslot Hsh) as [Hfull Hdiv].
      assert (Hcont : forall x j, contents (write p1 b' 0 r) x j =
        if x =? b' then (if j =? 0 then Some r else None) else contents p x j).
      { intros x j. unfold write. proj. rewrite Hc1. unfold upd. rewrite Nat.eqb_refl.
        destruct (x =? b'); reflexivity. }
      apply (replace_seq_inv p c _ q (mk_sequence (seq_id q) (block_table q ++ [b']) (S (len q))));
        proj; fields; auto.
      + intros x. rewrite Hr1, count_app, count_one. specialize (Hm x). unfold upd.
        destruct (Nat.eqb_spec x b'), (Nat.eq_dec b' x); subst; try congruence; lia.
      + intros x Hx. destruct (Hf1 x Hx) as [Hne Hin]. rewrite Hr1, Hp1, !upd_neq by auto.
        apply (free_unused _ _ Hinv); auto.
      + intros x Hx. rewrite Hp1 in Hx. destruct (Nat.eq_dec x b') as [-> | Hne].
        { rewrite upd_eq in Hx. discriminate. }
        rewrite upd_neq in Hx by auto. rewrite Hk1.
        destruct (published_rows _ _ Hinv x Hx) as [L R]. split; auto.
        intros j Hj. rewrite Hcont. destruct (Nat.eqb_spec x b'); [contradiction | auto].
      + rewrite app_length. simpl. nia.
      + intros t Ht. unfold read. proj.
        destruct (Nat.eq_dec t (len q)) as [-> | Hne].
        * rewrite Hdiv, nth_error_app2, Nat.sub_diag by lia. cbn [nth_error].
          rewrite Hcont, Hslot, !Nat.eqb_refl, Hnew. reflexivity.
        * assert (t < len q) by lia. rewrite Hold by auto.
          rewrite nth_error_app1 by (apply div_lt; lia).
          rewrite <- (seq_rows _ _ Hinv q t Hq) by auto. unfold read.
          destruct (nth_error (block_table q) (t / block_size)) as [x |] eqn:E; auto.
          rewrite Hcont. destruct (Nat.eqb_spec x b'); auto.
          subst. exfalso. apply Hb'q. eapply nth_error_In; eauto.
      + intros q0 x j Hq0 Hx. rewrite Hcont. destruct (Nat.eqb_spec x b'); auto.
        subst. exfalso. apply (unmapped_not_in b' _ q0 Hb'o Hq0 Hx).
    - (* Inside a block: the block of position len q is in the table. *)
      apply Nat.eqb_neq in Hslot.
      destruct (partial_block (len q) (length (block_table q)) Hslot (proj1 Hsh)) as [Hroom Hi].
      assert (Hb : nth_error (block_table q) (len q / block_size) =
                   Some (nth (len q / block_size) (block_table q) 0))
        by (apply nth_error_nth'; auto).
      set (b := nth (len q / block_size) (block_table q) 0) in *.
      destruct (mapped_not_free p c q b Hinv Hq (nth_error_In _ _ Hb)) as [Hb1 Hbfree].
      destruct ((refcount p b <=? 1) && negb (published p b)) eqn:Hown.
      + (* Our own block, unpublished: write in place. *)
        apply andb_prop in Hown as [Hr1 Hp1]. apply Nat.leb_le in Hr1. apply negb_true_iff in Hp1.
        injection H as <-.
        assert (Hcount1 : count b (block_table q) <= 1) by (specialize (Hm b); lia).
        assert (Hbo : mapped b (others (seq_id q) (seqs p)) = 0).
        { specialize (Hm b). pose proof (count_in b _ (nth_error_In _ _ Hb)). lia. }
        assert (Hcont : forall x j, contents (write p b (len q mod block_size) r) x j =
          if x =? b then (if j =? len q mod block_size then Some r else contents p b j)
          else contents p x j).
        { intros x j. unfold write, upd. proj. destruct (Nat.eqb_spec x b); subst; reflexivity. }
        apply (replace_seq_inv p c _ q (mk_sequence (seq_id q) (block_table q) (S (len q))));
          proj; fields; auto.
        * apply (free_distinct _ _ Hinv).
        * apply (free_unused _ _ Hinv).
        * intros x Hx. destruct (published_rows _ _ Hinv x Hx) as [L R]. split; auto.
          intros j Hj. rewrite Hcont. destruct (Nat.eqb_spec x b); [subst; congruence | auto].
        * lia.
        * intros t Ht. unfold read. proj.
          destruct (Nat.eq_dec t (len q)) as [-> | Hne].
          -- rewrite Hb, Hcont, !Nat.eqb_refl, Hnew. reflexivity.
          -- assert (Htl : t < len q) by lia. rewrite Hold by auto.
             rewrite <- (seq_rows _ _ Hinv q t Hq) by auto. unfold read.
             destruct (nth_error (block_table q) (t / block_size)) as [x |] eqn:E; auto.
             rewrite Hcont. destruct (Nat.eqb_spec x b) as [-> |]; auto.
             assert (Ei : t / block_size = len q / block_size)
               by (apply (count_one_index (block_table q) b); auto).
             pose proof (same_block_slot t (len q) Htl Ei).
             destruct (Nat.eqb_spec (t mod block_size) (len q mod block_size)); [lia | reflexivity].
        * intros q0 x j Hq0 Hx. rewrite Hcont. destruct (Nat.eqb_spec x b); auto.
          subst. exfalso. apply (unmapped_not_in b _ q0 Hbo Hq0 Hx).
      + (* Shared or published: copy-on-write into a fresh block b', release b, write into b'. *)
        destruct (allocate p v) as [[b' p1] |] eqn:A; [| discriminate]. injection H as <-.
        destruct (allocate_spec p v b' p1 (free_distinct _ _ Hinv) (free_unused _ _ Hinv) A)
          as (H0 & Hc1 & Hr1 & Hp1 & Hk1 & Hs1 & Hnd1 & Hf1).
        assert (Hb'q : ~ In b' (block_table q)) by (apply (unreferenced_unmapped p c); auto).
        assert (Hb'o : mapped b' (others (seq_id q) (seqs p)) = 0) by (specialize (Hm b'); lia).
        assert (Hbb' : b <> b') by (intros E; apply Hb'q; rewrite <- E; eapply nth_error_In; eauto).
        destruct (release_all_spec [b] (copy_block p1 b' b))
          as (Hc3 & Hp3 & Hk3 & Hs3 & Hr3 & Hnd3 & Hf3).
        { intros x. fields. rewrite Hr1, count_one. unfold upd.
          destruct (Nat.eq_dec b x) as [<- | Hne]; [| lia].
          destruct (Nat.eqb_spec b b'); [congruence | lia]. }
        { fields. auto. }
        { intros x Hx. fields. destruct (Hf1 x Hx) as [Hne Hin]. rewrite Hr1, Hp1, !upd_neq by auto.
          apply (free_unused _ _ Hinv); auto. }
        rewrite release_one.
        assert (Hcont : forall x j,
          contents (write (release_all (copy_block p1 b' b) [b]) b' (len q mod block_size) r) x j =
          if x =? b' then (if j =? len q mod block_size then Some r else contents p b j)
          else contents p x j).
        { intros x j. unfold write. proj. rewrite Hc3. unfold copy_block. proj. rewrite Hc1.
          unfold upd. rewrite !Nat.eqb_refl.
          destruct (Nat.eqb_spec x b'), (Nat.eqb_spec b b'); try congruence; reflexivity. }
        apply (replace_seq_inv p c _ q
                 (mk_sequence (seq_id q) (replace (len q / block_size) b' (block_table q))
                    (S (len q))));
          proj; fields; auto.
        * intros x. rewrite Hr3. fields. rewrite Hr1.
          pose proof (count_replace (block_table q) (len q / block_size) b' x Hi) as Hcr.
          fold b in Hcr.
          rewrite !count_one in *. specialize (Hm x). unfold upd.
          destruct (Nat.eqb_spec x b'), (Nat.eq_dec b x), (Nat.eq_dec b' x); subst;
            try congruence; lia.
        * intros x Hx. rewrite Hp3 in Hx. rewrite Hk3. fields. rewrite Hp1 in Hx. rewrite Hk1.
          destruct (Nat.eq_dec x b') as [-> | Hne]; [rewrite upd_eq in Hx; discriminate |].
          rewrite upd_neq in Hx by auto.
          destruct (published_rows _ _ Hinv x Hx) as [L R]. split; auto.
          intros j Hj. rewrite Hcont. destruct (Nat.eqb_spec x b'); [contradiction | auto].
        * rewrite replace_length. lia.
        * intros t Ht. unfold read. proj. rewrite nth_error_replace by auto.
          destruct (Nat.eq_dec t (len q)) as [-> | Hne].
          -- rewrite Nat.eqb_refl, Hcont, !Nat.eqb_refl, Hnew. reflexivity.
          -- assert (Htl : t < len q) by lia. rewrite Hold by auto.
             rewrite <- (seq_rows _ _ Hinv q t Hq) by auto. unfold read.
             destruct (Nat.eqb_spec (t / block_size) (len q / block_size)) as [Ei | Ei].
             ++ rewrite Ei, Hb, Hcont, Nat.eqb_refl.
                pose proof (same_block_slot t (len q) Htl Ei).
                destruct (Nat.eqb_spec (t mod block_size) (len q mod block_size));
                  [lia | reflexivity].
             ++ destruct (nth_error (block_table q) (t / block_size)) as [x |] eqn:E; auto.
                rewrite Hcont. destruct (Nat.eqb_spec x b'); auto.
                subst. exfalso. apply Hb'q. eapply nth_error_In; eauto.
        * intros q0 x j Hq0 Hx. rewrite Hcont. destruct (Nat.eqb_spec x b'); auto.
          subst. exfalso. apply (unmapped_not_in b' _ q0 Hb'o Hq0 Hx).
  Qed.

  Lemma pool_step_inv : forall o p c p', Inv p c -> pool_step o p c = Some p' ->
    Inv p' (contiguous c o (hit_rows p o)).
  Proof.
    intros o p c p' Hinv H. destruct o; cbn [contiguous hit_rows].
    - eapply new_request_inv; eauto.
    - eapply append_inv; eauto.
    - eapply fork_inv; eauto.
    - eapply rollback_inv; eauto.
    - eapply free_inv; eauto.
    - eapply publish_inv; eauto.
  Qed.

  Lemma step_inv : forall st o, Inv (fst st) (snd st) -> Inv (fst (step st o)) (snd (step st o)).
  Proof.
    intros [p c] o Hinv. unfold step. destruct (pool_step o p c) eqn:E; simpl; auto.
    eapply pool_step_inv; eauto.
  Qed.

  Lemma empty_inv : forall n_blocks, Inv (empty_pool n_blocks) (fun _ => []).
  Proof.
    intros n. constructor; cbn; auto.
    - constructor.
    - apply seq_NoDup.
    - intros; discriminate.
    - intros _ [].
    - intros _ t [].
  Qed.

  Lemma fold_inv : forall ops st, Inv (fst st) (snd st) ->
    Inv (fst (fold_left step ops st)) (snd (fold_left step ops st)).
  Proof.
    induction ops as [| o ops IH]; intros st H; simpl; auto. apply IH, step_inv, H.
  Qed.

  Lemma run_inv : forall n_blocks ops, Inv (fst (run n_blocks ops)) (snd (run n_blocks ops)).
  Proof. intros n ops. apply fold_inv, empty_inv. Qed.

  Lemma run_inv' : forall n_blocks ops p c, run n_blocks ops = (p, c) -> Inv p c.
  Proof. intros n ops p c E. pose proof (run_inv n ops) as H. rewrite E in H. exact H. Qed.

  (* An operation keeps every sequence other than its target, record and rows. *)
  Lemma pool_step_frame : forall o p c p' q, pool_step o p c = Some p' ->
    In q (seqs p) -> seq_id q <> target o -> In q (seqs p').
  Proof.
    intros o p c p' q H Hq Hne.
    destruct o; cbn [pool_step target] in H, Hne;
      repeat (match type of H with context [match ?x with _ => _ end] => destruct x end;
              try discriminate);
      injection H as <-; cbn [with_seqs seqs];
      first [right; apply in_others; auto | apply in_others; auto | right; auto | auto].
  Qed.

  Lemma contiguous_frame : forall c o h s, s <> target o -> contiguous c o h s = c s.
  Proof.
    intros c o h s Hne. destruct o; cbn [contiguous target] in *; auto; apply upd_neq; auto.
  Qed.

  (* ---------------------------------------------------------------------------------------- *)
  (* The theorems: for every sequence of operations from an empty pool of n_blocks blocks *)

  (* (a) Every live sequence reads, through its block table, the rows of its contiguous array. *)
  Theorem paged_refines_contiguous : forall n_blocks ops p c, run n_blocks ops = (p, c) ->
    forall q, In q (seqs p) ->
      length (c (seq_id q)) = len q /\
      forall t, t < len q -> read p q t = nth_error (c (seq_id q)) t.
  Proof.
    intros n ops p c E q Hq. pose proof (run_inv' n ops p c E) as Hinv.
    split; [apply (seq_shape _ _ Hinv); auto | intros t Ht; apply (seq_rows _ _ Hinv); auto].
  Qed.

  (* (b) A block's reference count is the number of block-table entries that map it. *)
  Theorem refcount_counts_entries : forall n_blocks ops p c, run n_blocks ops = (p, c) ->
    forall b, refcount p b = mapped b (seqs p).
  Proof. intros n ops p c E. apply (refcount_mapped _ _ (run_inv' n ops p c E)). Qed.

  (* (c) No block is both free and mapped. *)
  Theorem free_blocks_unmapped : forall n_blocks ops p c, run n_blocks ops = (p, c) ->
    forall b q, In b (free_list p) -> In q (seqs p) -> ~ In b (block_table q).
  Proof.
    intros n ops p c E b q Hb Hq Hin. pose proof (run_inv' n ops p c E) as Hinv.
    destruct (mapped_not_free p c q b Hinv Hq Hin). contradiction.
  Qed.

  (* (d) An operation on one sequence (an append writes) leaves every other sequence in place,
     reading what it read before. *)
  Theorem other_sequences_unchanged : forall n_blocks ops o p c p' c',
    run n_blocks ops = (p, c) -> step (p, c) o = (p', c') ->
    forall q, In q (seqs p) -> seq_id q <> target o ->
      In q (seqs p') /\ forall t, t < len q -> read p' q t = read p q t.
  Proof.
    intros n ops o p c p' c' E Hstep q Hq Hne. pose proof (run_inv' n ops p c E) as Hinv.
    unfold step in Hstep. destruct (pool_step o p c) as [p1 |] eqn:Ho.
    - injection Hstep as <- <-.
      assert (Hq' : In q (seqs p1)) by (eapply pool_step_frame; eauto).
      pose proof (pool_step_inv o p c p1 Hinv Ho) as Hinv'.
      split; auto. intros t Ht.
      rewrite (seq_rows _ _ Hinv' q t Hq' Ht), (seq_rows _ _ Hinv q t Hq Ht).
      rewrite contiguous_frame; auto.
    - injection Hstep as <- <-. auto.
  Qed.

  (* The prefix cache: a published block still holds the rows it was published under. *)
  Theorem published_blocks_keep_rows : forall n_blocks ops p c, run n_blocks ops = (p, c) ->
    forall b, published p b = true ->
      forall j, j < block_size -> contents p b j = nth_error (key p b) j.
  Proof. intros n ops p c E b Hb. apply (published_rows _ _ (run_inv' n ops p c E) b Hb). Qed.

  (* A refused operation changes nothing (TooBig in the C++ test). *)
  Theorem refused_step_changes_nothing : forall p c o,
    pool_step o p c = None -> step (p, c) o = (p, c).
  Proof. intros p c o H. unfold step. rewrite H. reflexivity. Qed.

End Paged.
